#!/bin/sh
# Build-stage helper for the Dockerfiles: copies the kvserve binary and the shared libraries the
# build made (e.g. the CUDA backend, loaded with dlopen) into OUT/bin, and writes OUT/packages: the
# Debian packages that own every shared library they link, for the runtime stage to apt-get install.
# Libraries no package owns (the NVIDIA driver's libcuda, mounted by the container runtime on GPU
# nodes) are skipped. Usage: collect-runtime.sh BUILD_DIR OUT
set -eu
build=$1
out=$2
mkdir -p "$out/bin"
cp "$build/kvserve" "$out/bin/"
find "$build" -name 'lib*.so*' -type f -not -path '*/CMakeFiles/*' -exec cp {} "$out/bin/" \;
: >"$out/packages.all"
for f in "$out"/bin/*; do
  ldd "$f" | awk '/=> \// { print $3 }' | while read -r lib; do
    real=$(readlink -f "$lib")
    # Debian 12 has a merged /usr: dpkg may record either spelling of the path.
    alt=$(echo "$real" | sed -e 's#^/usr/lib/#/lib/#;t' -e 's#^/lib/#/usr/lib/#')
    pkg=$(dpkg -S "$lib" "$real" "$alt" 2>/dev/null | head -n 1 | cut -d: -f1) || true
    [ -n "$pkg" ] && echo "$pkg" >>"$out/packages.all"
  done
done
# libc6 and libgcc-s1 are in every Debian image; keep the list to what needs installing.
sort -u "$out/packages.all" | grep -v -x -e libc6 -e libgcc-s1 >"$out/packages" || true
rm "$out/packages.all"
echo "runtime packages: $(tr '\n' ' ' <"$out/packages")"
