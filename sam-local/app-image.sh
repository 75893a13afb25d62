#!/bin/bash
# The image `make sam-local` runs the functions on: the Lambda-like base image with the layer
# `sam build` built added at /opt (where Lambda unpacks layers), its Python compiled to bytecode,
# and a copy of the built template without the functions' `Layers` (template-local.yaml, beside
# template.yaml so its CodeUris resolve). Why, in sam-local/run.sh (step 3b).
#
# The image is named after the base image and the layer's contents
# (local/leaseguard-app-HASH:3.12): SAM builds its emulator image on top once per name
# (HASH:rapid-x86_64) and never again, so a changed layer has to be a new name. Images of
# earlier layers are removed.
#
# usage: sam-local/app-image.sh BASE_IMAGE PYTHON312 BUILD_DIR OUT_FILE   (OUT_FILE: the name)
set -euo pipefail
base=$1 python312=$2 app=$3 out=$4
layer=$app/LeaseguardLayer
[ -d "$layer/python" ] || { echo "no built layer in $layer" >&2; exit 1; }

# The layer's .pyc: unchecked-hash, used whatever the source's mtime (docker's ADD sets its
# own), and the same bytes for the same source, so the image's name stays the same. The
# functions' code is mounted from the build directory, where an edit must not run stale
# bytecode: checked-hash. -q prints only what does not compile (a vendored test file may not);
# that is no reason to stop, the import check below is.
"$python312" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$layer/python" >/dev/null \
    || echo "compileall: some files of the layer did not compile"
"$python312" -m compileall -q --invalidation-mode checked-hash "$app"/*Function >/dev/null

digest=$( { docker image inspect -f '{{.Id}}' "$base";
    cd "$layer" && find . -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum; } \
    | sha256sum | cut -c1-16)
image=local/leaseguard-app-$digest:3.12
if ! docker image inspect "$image" >/dev/null 2>&1; then
    printf 'FROM %s\nADD python /opt/python\n' "$base" \
        | docker build -q -t "$image" -f - "$layer" >/dev/null
    echo "built $image"
fi
docker run --rm --entrypoint /var/lang/bin/python3 -e PYTHONPATH=/opt/python "$image" \
    -c 'import leaseguard.batch, leaseguard.providers.redis, leaseguard.providers.dynamodb, aws_lambda_powertools'
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' 'local/leaseguard-app-*'); do
    case $old in "local/leaseguard-app-$digest:"*) ;; *) docker rmi "$old" >/dev/null ;; esac
done

# The functions' Layers go; the rest of the built template stays as sam build wrote it.
layers=$'    Layers:\n    - Ref: LeaseguardLayer\n'
template=$(cat "$app/template.yaml"; echo x)
template=${template%x}
case $template in *"$layers"*) ;; *) echo "the built template's Globals have no Layers: [LeaseguardLayer]" >&2; exit 1 ;; esac
printf '%s' "${template/"$layers"/}" >"$app/template-local.yaml"
echo "$image" >"$out"
