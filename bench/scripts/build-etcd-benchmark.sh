#!/usr/bin/env bash
# build-etcd-benchmark.sh OUT: builds etcd's own load generator
# (tools/benchmark of etcd 3.4.23, the `benchmark` etcd's docs quote) into
# the file OUT, offline from the Debian archive alone:
#   - Go and every library it imports come from Debian packages (golang-go,
#     golang-etcd-server-dev and its dependencies under /usr/share/gocode;
#     scripts/deps.sh --bench installs them);
#   - tools/benchmark is not in those packages, so its source is taken from
#     the upstream tarball of Debian's etcd source package, downloaded with
#     `apt-get source --download-only` through a private deb-src list in a
#     temp dir (the machine's apt configuration is not touched);
#   - built in GOPATH mode with no module proxy (GO111MODULE=off,
#     GOPROXY=off), static (CGO_ENABLED=0).
# Run as root (apt-get). It took 2.6 minutes on a loaded 2-core machine with
# the packages in, and prints how long it took.
set -euo pipefail
OUT=${1:?usage: build-etcd-benchmark.sh OUT}
T0=$(date +%s)
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
for p in golang-go golang-etcd-server-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "build-etcd-benchmark: $p is not installed (bash scripts/deps.sh --bench)" >&2; exit 2; }
done
T=$(mktemp -d "${TMPDIR:-/tmp}/etcd-benchmark.XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T"

# The source package of the same version as the Go libraries.
VER=$(dpkg-query -W -f='${Version}' golang-etcd-server-dev)
UP=${VER%-*}
MIRROR=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list)
SUITE=$(. /etc/os-release && echo "$VERSION_CODENAME")
mkdir -p lists/partial
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" >src.list
APT=(-o Dir::Etc::SourceList="$T/src.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$T/lists" -o APT::Sandbox::User=root)
apt-get "${APT[@]}" -qq update
apt-get "${APT[@]}" -qq source --download-only "etcd=$VER"

SRC=$T/gopath/src/go.etcd.io/etcd/tools
mkdir -p "$SRC"
tar -xzf "etcd_$UP.orig.tar.gz" -C "$SRC" --strip-components=2 "etcd-$UP/tools/benchmark"
cd "$SRC/benchmark"
env GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0 GOPATH="$T/gopath:/usr/share/gocode" \
  GOCACHE="$T/gocache" go build -o "$OUT" .
"$OUT" --help >/dev/null
echo "build-etcd-benchmark: $OUT (etcd $UP tools/benchmark), $(($(date +%s) - T0)) s"
