#!/usr/bin/env bash
# Builds the file tree of roamguard's container image under DESTDIR, from this checkout with its
# dependencies installed (`npm ci`). The Dockerfile runs it in its build stage and copies DESTDIR
# onto the runtime image's root; test/system/image-tree.test.ts runs it into a temporary directory
# and starts the agent and the data plane from the result, so both build the same tree.
#
#   scripts/build-image-tree.sh [--runtime node|bun] [--cni-dir DIR] DESTDIR
#
# The tree:
#   DESTDIR/opt/roamguard/               the TypeScript sources and the JavaScript compiled from
#                                        them (scripts/compile.mjs: what runs, on either runtime),
#                                        package.json, package-lock.json, production node_modules
#                                        (+ Bun's package with --runtime bun)
#   DESTDIR/opt/roamguard/cni/bin/       the standard CNI plugins the conflist uses (loopback,
#                                        host-local, ptp, portmap), copied from --cni-dir (default
#                                        /usr/lib/cni, Debian's containernetworking-plugins); the
#                                        agent installs them into the host's /opt/cni/bin when
#                                        missing (control/host/cni-install.ts)
#   DESTDIR/usr/local/bin/roamguard, roamguard-wg   links to the entry points
#
# nft, ip and libsodium come from the runtime image's Debian packages (see the Dockerfile).
# Works offline: node_modules is copied (hard links where possible) and pruned with npm.
set -euo pipefail

runtime=node
cni_dir=/usr/lib/cni
usage() { echo "usage: $0 [--runtime node|bun] [--cni-dir DIR] DESTDIR" >&2; exit 2; }
while (($# > 0)); do
  case "$1" in
    --runtime) runtime=${2:-}; shift 2 || usage ;;
    --runtime=*) runtime=${1#--runtime=}; shift ;;
    --cni-dir) cni_dir=${2:-}; shift 2 || usage ;;
    --cni-dir=*) cni_dir=${1#--cni-dir=}; shift ;;
    -h|--help) usage ;;
    -*) echo "build-image-tree: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
(($# == 1)) || usage
[[ $runtime == node || $runtime == bun ]] || { echo "build-image-tree: --runtime must be node or bun, got '$runtime'" >&2; exit 2; }
dest=$1
root=$(cd "$(dirname "$0")/.." && pwd)
app=$dest/opt/roamguard
plugins=(loopback host-local ptp portmap)

[[ -f $root/node_modules/tsx/package.json ]] || { echo "build-image-tree: run 'npm ci' in $root first" >&2; exit 1; }
for p in "${plugins[@]}"; do
  [[ -x $cni_dir/$p ]] || { echo "build-image-tree: CNI plugin $cni_dir/$p is missing (install containernetworking-plugins, or pass --cni-dir)" >&2; exit 1; }
done
if [[ -e $app ]]; then echo "build-image-tree: $app already exists" >&2; exit 1; fi
mkdir -p "$app" "$app/cni/bin" "$dest/usr/local/bin"

# Sources: everything the commands load (bench/ too: `roamguard --help` reads every command's
# summary) and the files those reach by relative imports elsewhere (the bench's namespace helpers
# under test/ and lab/): scripts/image-sources.mjs. No tests, results or the checkout's tooling.
cp -a "$root/package.json" "$root/package-lock.json" "$app/"
[[ -f $root/README.md ]] && cp -a "$root/README.md" "$app/"
while IFS= read -r file; do
  [[ -n $file ]] || continue
  mkdir -p "$app/$(dirname "$file")"
  cp -a "$root/$file" "$app/$file"
done < <(node "$root/scripts/image-sources.mjs" bin dataplane control bench)
[[ -d $root/deploy ]] && cp -a "$root/deploy" "$app/"
for entry in bin/roamguard bin/roamguard-wg; do cp -a "$root/$entry" "$app/$entry"; done

# Dependencies: a copy of the checkout's node_modules (hard links when on the same file system),
# pruned to production. Hard-linked files are only ever unlinked here, never written.
cp -al "$root/node_modules" "$app/node_modules" 2>/dev/null || { rm -rf "$app/node_modules"; cp -a "$root/node_modules" "$app/node_modules"; }
(cd "$app" && npm prune --omit=dev --offline --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
find "$app/node_modules" -mindepth 1 -type d -empty -delete
if [[ $runtime == bun ]]; then
  # Bun is a dev dependency of the checkout (the npm package ships the binary): keep it.
  for pkg in bun @oven; do
    [[ -d $root/node_modules/$pkg ]] || continue
    cp -al "$root/node_modules/$pkg" "$app/node_modules/$pkg" 2>/dev/null || { rm -rf "$app/node_modules/$pkg"; cp -a "$root/node_modules/$pkg" "$app/node_modules/$pkg"; }
  done
  mkdir -p "$app/node_modules/.bin"
  cp -a "$root/node_modules/.bin/bun" "$app/node_modules/.bin/bun"
  "$app/node_modules/.bin/bun" --version >/dev/null
fi

# The image runs JavaScript, compiled here from its own copy of the sources (with the esbuild
# that tsx brings, a production dependency): no start transpiles, and the read-only root file
# system needs no transpile cache.
node "$root/scripts/compile.mjs" "$app" >/dev/null
# The native helpers (scripts/build-native.mjs: the OpenSSL AEAD of the openssl-ffi crypto
# provider), built in the tree from their C sources when a compiler is at hand; without one the
# data plane uses the next provider (libsodium-ffi).
for src in dataplane/crypto/native/openssl-aead.c; do
  [[ -f $root/$src ]] || continue
  mkdir -p "$app/$(dirname "$src")"
  cp -a "$root/$src" "$app/$src"
done
node "$root/scripts/build-native.mjs" "$app" >/dev/null

for p in "${plugins[@]}"; do install -m 0755 "$cni_dir/$p" "$app/cni/bin/$p"; done
ln -s /opt/roamguard/bin/roamguard "$dest/usr/local/bin/roamguard"
ln -s /opt/roamguard/bin/roamguard-wg "$dest/usr/local/bin/roamguard-wg"
echo "$runtime" > "$app/RUNTIME"
echo "build-image-tree: $app ($runtime, $(du -sh "$app" | cut -f1))"
