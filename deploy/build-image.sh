#!/usr/bin/env bash
# Builds the `llm-replay` container image from this machine's own release binaries, on an
# empty (`scratch`) base: no registry is needed. The binaries are stripped on the way in (their
# symbols and line tables are kept out of the image, in target/image-debug/, linked by
# .gnu_debuglink), and dynamically linked, so the shared libraries they load (from `ldd`) are
# copied in beside them. Nothing else goes in: an /etc/passwd naming the non-root user 65532,
# name resolution for `--coordinator coordinator:7070`, and a world-writable (sticky) /tmp and
# /reports, so the image works as 65532 or as any other uid it is run with.
#
#   deploy/build-image.sh [--prebuilt DIR] [TAG]      (default tag: llm-replay:local)
#
# --prebuilt DIR takes `llm-replay` and `llm-replay-worker` from DIR as they are, without
# running cargo (the integration test passes the binaries `cargo test` just built, so that
# this script never rebuilds them with other features). Without it, the two binaries are
# built with `cargo build --release`.
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
  cargo build --release --bin llm-replay --bin llm-replay-worker
  bin_dir="$target_dir/release"
fi
for name in llm-replay llm-replay-worker; do
  [ -x "$bin_dir/$name" ] || { echo "build-image.sh: no $bin_dir/$name" >&2; exit 2; }
done

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
debug_dir="$target_dir/image-debug"
mkdir -p "$context/bin" "$context/etc" "$debug_dir"

# Strip: the symbols go to target/image-debug/NAME.debug (for gdb, `eu-stack`, addr2line).
for name in llm-replay llm-replay-worker; do
  objcopy --only-keep-debug "$bin_dir/$name" "$debug_dir/$name.debug"
  objcopy --strip-all --add-gnu-debuglink="$debug_dir/$name.debug" \
    "$bin_dir/$name" "$context/bin/$name"
done

# The shared libraries the binaries load (libc, libm, libgcc_s, the loader), then the NSS
# modules glibc loads by name (never listed by ldd) to resolve service names.
libraries() {
  for binary in "$context"/bin/*; do
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
