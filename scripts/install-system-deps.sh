#!/usr/bin/env bash
# Installs the Debian packages roamguard's tests use, only when something is missing.
# --no-install-recommends matters: without it wireguard-tools pulls in a kernel and systemd.
set -euo pipefail

# command-or-path(glob)  package
# (gcc and libc6-dev: the handshake flood test compiles its flooder, test/system/flooder.c, and
#  scripts/build-native.mjs the OpenSSL AEAD helper, which links libcrypto.so.3 (libssl3);
#  kubectl: the lab API server's kubectl tests, any kubectl will do, Debian's is kubernetes-client;
#  chromium: the demo page's test drives it headless)
needs=(
  "wireguard-go   wireguard-go"
  "wg             wireguard-tools"
  "wg-quick       wireguard-tools"
  "iperf3         iperf3"
  "nft            nftables"
  "ip             iproute2"
  "ping           iputils-ping"
  "/usr/lib/cni/ptp containernetworking-plugins"
  "conntrack      conntrack"
  "/usr/lib/*/libsodium.so.23 libsodium23"
  "/usr/lib/*/libcrypto.so.3 libssl3"
  "gcc            gcc"
  "/usr/include/*/sys/socket.h libc6-dev"
  "kubectl        kubernetes-client"
  "chromium       chromium"
)

missing=()
for line in "${needs[@]}"; do
  read -r what pkg <<<"$line"
  if [[ $what == /* ]]; then
    compgen -G "$what" >/dev/null || missing+=("$pkg")  # a path, possibly a glob
  else
    command -v "$what" >/dev/null 2>&1 || [[ -x /usr/sbin/$what || -x /sbin/$what ]] || missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
