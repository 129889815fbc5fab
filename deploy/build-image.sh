#!/usr/bin/env bash
# Builds the `llm-replay` container image from this machine's own release binary, on an
# empty (`scratch`) base: no registry is needed. The image carries one binary, `llm-replay`,
# and `llm-replay-worker` as a symbolic link to it: run under that name, `llm-replay` is the
# worker binary (same flags, help and version; cli/src/main.rs), and a second binary would
# carry a second copy of everything both link (issue 34: 47.3 MB with two, 33.4 MB with one).
# The binary is stripped on the way in (its symbols and line tables are kept out of the image,
# in target/image-debug/, linked by .gnu_debuglink), and dynamically linked, so the shared
# libraries it loads (from `ldd`) are copied in beside it. Nothing else goes in: an
# /etc/passwd naming the non-root user 65532, name resolution for `--coordinator
# coordinator:7070`, and a world-writable (sticky) /tmp and /reports, so the image works as
# 65532 or as any other uid it is run with.
#
#   deploy/build-image.sh [--prebuilt DIR] [TAG]      (default tag: llm-replay:local)
#
# --prebuilt DIR takes `llm-replay` from DIR as it is, without running cargo (the integration
# test passes the binary `cargo test` just built, so that this script never rebuilds it with
# other features). Without it, the binary is built with `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."

prebuilt=""
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt="${2:?--prebuilt needs a directory}"
  shift 2
fi
tag="${1:-llm-replay:local}"
target_dir="${CARGO_TARGET_DIR:-target}"

if [ -n "$prebuilt" ]; then
  bin_dir="$prebuilt"
else
  cargo build --release --bin llm-replay
  bin_dir="$target_dir/release"
fi
[ -x "$bin_dir/llm-replay" ] || { echo "build-image.sh: no $bin_dir/llm-replay" >&2; exit 2; }

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
debug_dir="$target_dir/image-debug"
mkdir -p "$context/bin" "$context/etc" "$debug_dir"

# Strip: the symbols go to target/image-debug/llm-replay.debug (for gdb, `eu-stack`,
# addr2line).
objcopy --only-keep-debug "$bin_dir/llm-replay" "$debug_dir/llm-replay.debug"
objcopy --strip-all --add-gnu-debuglink="$debug_dir/llm-replay.debug" \
  "$bin_dir/llm-replay" "$context/bin/llm-replay"
# The worker's name (the image's entrypoint, and the command of the Compose and Kubernetes
# workers): a relative link, which `COPY` keeps as a link.
ln -s llm-replay "$context/bin/llm-replay-worker"

# The shared libraries the binary loads (libc, libm, libgcc_s, the loader), then the NSS
# modules glibc loads by name (never listed by ldd) to resolve service names.
libraries() {
  for binary in "$context"/bin/llm-replay; do
    ldd "$binary" | awk '/=>/ {print $3; next} $1 ~ /^\// {print $1}'
  done
  for lib in /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libnss_files.so.2 \
             /lib/x86_64-linux-gnu/libresolv.so.2; do
    [ -e "$lib" ] && echo "$lib"
  done
}
libraries | sort -u | while read -r lib; do
  [ -n "$lib" ] && [ -e "$lib" ] && cp --parents -L "$lib" "$context/"
done

echo 'hosts: files dns' > "$context/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/reports:/sbin/nologin\n' \
  > "$context/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$context/etc/group"
# Sticky and world-writable like any /tmp: the coordinator writes its reports to /reports
# (mount a host directory or a volume there) whatever uid it runs as.
mkdir -m 1777 "$context/tmp" "$context/reports"
chmod 1777 "$context/tmp" "$context/reports"

cp deploy/Dockerfile "$context/Dockerfile"
printf 'Dockerfile\n.dockerignore\n' > "$context/.dockerignore"
docker build -q -t "$tag" "$context" >/dev/null
size="$(docker image inspect -f '{{.Size}}' "$tag")"
echo "built $tag: $(awk -v b="$size" 'BEGIN {printf "%.1f MB", b / 1e6}') ($size bytes;" \
  "symbols in $debug_dir/)"
