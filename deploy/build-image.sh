#!/usr/bin/env bash
# Builds the `llm-replay` container image from this machine's own release binaries, on an
# empty (`scratch`) base: no registry is needed. The binaries are dynamically linked, so the
# shared libraries they load (from `ldd`) are copied in beside them.
#
#   deploy/build-image.sh [TAG]        (default tag: llm-replay:local)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llm-replay:local}"
cargo build --release --bins -p llm-replay -p llm-replay-worker
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/bin" "$context/tmp"
cp target/release/llm-replay target/release/llm-replay-worker "$context/bin/"
for binary in "$context"/bin/*; do
  ldd "$binary" | awk '/=>/ {print $3; next} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -n "$lib" ] && [ -e "$lib" ] && cp --parents -L "$lib" "$context/"
  done
done
# Name resolution for `--coordinator coordinator:7070` inside the container.
mkdir -p "$context/etc"
echo 'hosts: files dns' > "$context/etc/nsswitch.conf"
for lib in /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libnss_files.so.2 \
           /lib/x86_64-linux-gnu/libresolv.so.2; do
  [ -e "$lib" ] && cp --parents -L "$lib" "$context/"
done
cp deploy/Dockerfile "$context/Dockerfile"
docker build -q -t "$tag" "$context"
echo "built $tag"
