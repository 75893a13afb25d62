#!/bin/bash
# Builds a Lambda-like python3.12 image from Debian's package registry alone, for machines that
# cannot pull public.ecr.aws/lambda/python: a debootstrap'd bookworm, the shared libraries Python
# needs, pyenv's (or $PYTHON312's) Python 3.12 at its own path, the runtime interface client
# (awslambdaric) from PyPI in /var/runtime, and, as the python3.12 runtime has it, boto3 in the
# interpreter's site-packages (Lambda's /var/lang/lib/python3.12/site-packages, after the
# function and its layers on the path): BOTO3 and BOTOCORE, the versions the layer relies on
# the runtime for (the Makefile's RUNTIME_BOTO3, leaseguard's floor). `sam local ...
# --invoke-image IMAGE` runs the functions on it; SAM adds its runtime interface emulator on top.
#
# usage: sam-local/build-image.sh IMAGE PYTHON312 BOTO3 BOTOCORE  (does nothing if IMAGE exists)
set -euo pipefail
image=$1
python312=$(readlink -f "$2")
boto3_version=$3 botocore_version=$4
here=$(cd "$(dirname "$0")" && pwd)

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "sam-local: image $image already built"
    exit 0
fi
prefix=$(dirname "$(dirname "$python312")")   # .../versions/3.12.x
"$python312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/sam-local-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

echo "sam-local: debootstrap bookworm from $mirror (about 2 minutes, once)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2; echo "sam-local: FAILED: debootstrap" >&2; exit 1; }
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" apt-get install -y -q --no-install-recommends libssl3 libffi8 libsqlite3-0 \
    libbz2-1.0 liblzma5 zlib1g libreadline8 libncursesw6 libuuid1 ca-certificates >"$work/apt.log" 2>&1 || {
    tail -20 "$work/apt.log" >&2; echo "sam-local: FAILED: apt-get install in the image" >&2; exit 1; }
chroot "$root" apt-get clean

mkdir -p "$root$prefix" "$root/var/lang/bin" "$root/var/runtime" "$root/var/task" "$root/opt"
cp -a "$prefix/." "$root$prefix/"
ln -sf "$prefix/bin/python3.12" "$root/var/lang/bin/python3"
ln -sf "$prefix/bin/python3.12" "$root/var/lang/bin/python"
chroot "$root" /var/lang/bin/python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib'

mkdir -p "$root/wheels"
"$python312" -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$root/wheels" awslambdaric
chroot "$root" /bin/sh -c '/var/lang/bin/python3 -m pip install -q --no-index --target /var/runtime /wheels/*.whl'
rm -rf "$root/wheels"
mkdir -p "$root/wheels"
"$python312" -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$root/wheels" "boto3==$boto3_version" "botocore==$botocore_version"
chroot "$root" /bin/sh -c '/var/lang/bin/python3 -m pip install -q --no-index /wheels/*.whl'
chroot "$root" /var/lang/bin/python3 -c "import boto3; assert boto3.__version__ == '$boto3_version'"
rm -rf "$root/wheels"
install -m 0755 "$here/bootstrap" "$root/var/runtime/bootstrap"
: >"$root/etc/resolv.conf"

tar -C "$root" -c . | docker import \
    -c 'ENV LAMBDA_TASK_ROOT=/var/task' -c 'ENV LAMBDA_RUNTIME_DIR=/var/runtime' \
    -c 'ENV LANG=C.UTF-8' -c 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin' \
    -c 'WORKDIR /var/task' -c 'ENTRYPOINT ["/var/runtime/bootstrap"]' - "$image" >/dev/null
echo "sam-local: built $image"
