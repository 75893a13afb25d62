#!/bin/bash
# make sam-local: the SAM app end to end under `sam local`, offline, on this machine.
#
#   1. Docker: Debian's docker.io (and debootstrap) installed with apt if dockerd is absent;
#      dockerd started if none is running, with no iptables/NAT and a bridge of its own
#      (SAM_LOCAL_BRIDGE), so containers reach this machine at the bridge's gateway and nothing
#      else. A dockerd that already runs is used as it is.
#   2. The Lambda-like python3.12 image (sam-local/build-image.sh), with the runtime's boto3 as
#      RUNTIME_BOTO3 and RUNTIME_BOTOCORE name it (the Makefile sets them), built once and kept.
#   3. sam build for x86_64 into .aws-sam/sam-local, and the built layer added to the image
#      (sam-local/app-image.sh), which the functions run on from a copy of the built template
#      without `Layers` (see 3b below).
#   4. The end-to-end suite (sam-local/tests), which starts a Redis, a moto server, start-api
#      and start-lambda per backend and stops them by pid.
#   5. One line: `sam local: N checks passed`. Whatever this script started, it stops by pid.
#
# Any step that cannot run ends the script with one line `sam local: FAILED: ...`.
# usage (from the Makefile): sam-local/run.sh VENV_PYTHON SAM PYTHON312
set -uo pipefail

python=$1 sam=$2 python312=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
boto3_version=${RUNTIME_BOTO3:?set RUNTIME_BOTO3 (make sam-local does)}
botocore_version=${RUNTIME_BOTOCORE:?set RUNTIME_BOTOCORE (make sam-local does)}
# Named after the SDK in it: a new version is a new image (the old one is not rebuilt).
image=${SAM_LOCAL_IMAGE:-local/leaseguard-lambda-python:3.12-boto3-$boto3_version}
bridge=${SAM_LOCAL_BRIDGE:-172.29.77.1/24}
build_dir=$root/.aws-sam/sam-local
state=$build_dir/state
started_dockerd=""

fail() {
    echo "sam local: FAILED: $*" >&2
    exit 1
}

cleanup() {
    if [ -n "$started_dockerd" ] && kill -0 "$started_dockerd" 2>/dev/null; then
        kill "$started_dockerd"
        for _ in $(seq 1 30); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 1; done
    fi
}
trap cleanup EXIT

[ -n "$python312" ] || fail "no Python 3.12 found (pyenv install 3.12, or PYTHON312=/path/to/python3.12)"
"$python312" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
    || fail "$python312 is not Python 3.12"
mkdir -p "$state"

# 1. Docker
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || fail "dockerd or debootstrap is missing and installing them needs root"
    echo "sam-local: installing docker.io and debootstrap from Debian's packages"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap; } \
        >"$state/apt.log" 2>&1 || fail "apt-get install docker.io debootstrap (see $state/apt.log)"
fi
# The CLI that came with the daemon, when there is one (another docker on PATH may be newer).
docker=$(command -v /usr/bin/docker || command -v docker) || fail "no docker CLI"
export PATH="$(dirname "$docker"):$PATH"
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "no Docker daemon is running and starting one needs root"
    echo "sam-local: starting dockerd (no iptables, bridge $bridge)"
    dockerd --iptables=false --ip-masq=false --bip="$bridge" --pidfile "$state/dockerd.pid" \
        >"$state/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || fail "dockerd did not start (see $state/dockerd.log)"
fi
gateway=$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>/dev/null)
[ -n "$gateway" ] || fail "the Docker bridge has no gateway address"

# 2. The image
"$root/sam-local/build-image.sh" "$image" "$python312" "$boto3_version" "$botocore_version" \
    || fail "building the image $image"

# 3. sam build, for this machine's architecture
cd "$root" || fail "cd $root"
rm -rf build
PATH="$(dirname "$python312"):$PATH" AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0 \
    "$sam" build --parameter-overrides Architecture=x86_64 --build-dir "$build_dir/app" \
    >"$state/sam-build.log" 2>&1 || fail "sam build (see $state/sam-build.log)"
rm -rf build

# 3b. The built layer in the image, not as a SAM layer. `sam local` rebuilds its image for a
# function on every invocation when the function has a layer defined in the template (it sends
# the layer, 42 MB when it still held boto3, to dockerd again and waits for the build, one invocation at a time behind a
# lock): five concurrent cold requests queued 10 s each behind that and the owner they were
# forwarded to ran past its timeout. So the layer sam build made is added at /opt (where Lambda
# puts layers) to an image of its own, named after its contents, and the functions run from a
# copy of the built template without `Layers`. The layer's Python is compiled to bytecode
# first: /opt is thrown away with each container, so every cold start compiled it again.
"$root/sam-local/app-image.sh" "$image" "$python312" "$build_dir/app" "$state/app-image" \
    >"$state/app-image.log" 2>&1 || fail "the app image (see $state/app-image.log)"
app_image=$(cat "$state/app-image")

# 4. The suite
rm -rf "$build_dir/run" "$build_dir/results.jsonl" "$build_dir/report.xml"
SAM_LOCAL_GATEWAY=$gateway SAM_LOCAL_IMAGE=$app_image SAM_LOCAL_BUILD_DIR=$build_dir/app \
    SAM_LOCAL_TEMPLATE=$build_dir/app/template-local.yaml \
    SAM_LOCAL_SAM=$sam SAM_LOCAL_RESULTS=$build_dir/results.jsonl SAM_LOCAL_RUN_DIR=$build_dir/run \
    "$python" -m pytest sam-local/tests -p no:cacheprovider -q --timeout 900 \
    --junitxml "$build_dir/report.xml"
status=$?

# 5. The summary
read -r tests failures errors skipped < <("$python" - "$build_dir/report.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

try:
    suite = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 0, 1, 0)
    raise SystemExit
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
print(*(suite.get(name, "0") for name in ("tests", "failures", "errors", "skipped")))
EOF
)
if [ -s "$build_dir/results.jsonl" ]; then
    echo "sam-local: recorded (not asserted):"
    sed 's/^/  /' "$build_dir/results.jsonl"
fi
[ "$skipped" = 0 ] || fail "$skipped checks were skipped"
if [ "$status" -ne 0 ] || [ "$failures" != 0 ] || [ "$errors" != 0 ] || [ "$tests" = 0 ]; then
    fail "$failures of $tests checks failed, $errors errors (pytest exit $status)"
fi
echo "sam local: $tests checks passed"
