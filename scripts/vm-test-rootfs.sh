#!/usr/bin/env bash
# Builds the small guest image the vm backend's tests boot, until `dynocap image build debian`
# serves them: busybox-static plus Debian's cloud kernel (boot/vmlinuz-*, lib/modules/*),
# from the Debian mirror with apt-get download (no root needed for that part).
#
#   scripts/vm-test-rootfs.sh DIR     builds DIR (once; an existing DIR is left alone)
#
# The result is immutable: it is built in DIR.new-PID and renamed into place.
set -euo pipefail
dir=${1:?usage: vm-test-rootfs.sh DIR}
[[ -d $dir ]] && exit 0
for tool in apt-get apt-cache dpkg-deb; do
    command -v "$tool" >/dev/null || { echo "vm-test-rootfs: $tool is missing (Debian/Ubuntu only)" >&2; exit 1; }
done
stage="$dir.new-$$"
debs="$stage.debs"
trap 'rm -rf "$stage" "$debs"' EXIT
mkdir -p "$stage" "$debs"
# The metapackage names the current ABI's image package.
kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[[ -n $kernel_pkg ]] || { echo "vm-test-rootfs: cannot resolve linux-image-cloud-amd64 (run apt-get update)" >&2; exit 1; }
(cd "$debs" && apt-get download -q "$kernel_pkg" busybox-static 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$debs/x"; done
mkdir -p "$stage"/{bin,boot,lib/modules,etc,dev,proc,sys,tmp,run,root,home,var}
chmod 1777 "$stage/tmp"
cp -a "$debs"/x/boot/vmlinuz-* "$stage/boot/"
cp -a "$debs"/x/lib/modules/* "$stage/lib/modules/"
cp "$debs/x/bin/busybox" "$stage/bin/busybox"
for applet in $("$stage/bin/busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$stage/bin/$applet"
done
ln -s bin "$stage/sbin"
mkdir -p "$stage/usr"
ln -s ../bin "$stage/usr/bin"
printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n' >"$stage/etc/passwd"
printf 'root:x:0:\nsandbox:x:1000:\n' >"$stage/etc/group"
mv "$stage" "$dir"
