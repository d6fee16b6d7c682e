# roamguard's container image: the node agent (`roamguard agent`) and the userspace WireGuard data
# plane (`roamguard wg`), with nft, ip and the standard CNI plugins. deploy/roamguard.yaml runs it
# as a DaemonSet (agent and data plane in separate containers of one pod).
#
#   docker build -t roamguard .                          # Node.js 20
#   docker build -t roamguard:bun --build-arg RUNTIME=bun .   # Bun (from the npm package)
#
# Stage 1 installs the dependencies with their native parts (koffi's prebuilt FFI addon, esbuild
# for tsx, Bun's binary) and builds the image's file tree with scripts/build-image-tree.sh — the
# same script test/system/image-tree.test.ts runs, so the tree that is tested is the tree shipped.
# Stage 2 is a slim Node.js 20 runtime with the Debian packages roamguard calls.
#
# deploy/roamguard.yaml runs both containers from this image unprivileged: uid 0 (the host paths
# and the host network's configuration belong to root) with every capability dropped but
# NET_ADMIN, and a read-only root file system. Nothing here writes outside the mounted volumes at
# run time: the image runs the JavaScript compiled at build time (scripts/compile.mjs), so tsx
# needs no transpile cache (it would go to the temporary directory, an emptyDir on /tmp).

ARG NODE_IMAGE=node:20-bookworm-slim

FROM ${NODE_IMAGE} AS build
ARG RUNTIME=node
ENV DEBIAN_FRONTEND=noninteractive
# containernetworking-plugins: the CNI plugins copied into the image (installed on hosts that lack
# them); python3/make/g++ only for a native addon that has no prebuilt binary for this platform.
RUN apt-get update \
 && apt-get install -y --no-install-recommends containernetworking-plugins python3 make g++ ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json ./
# npm ci runs the `prepare` script (scripts/compile.mjs, scripts/build-native.mjs), which finds no
# sources yet and says so;
# build-image-tree.sh compiles the image's sources below.
COPY scripts/compile.mjs scripts/source-closure.mjs scripts/build-native.mjs scripts/
COPY bin/compiled.mjs bin/
RUN npm ci --no-audit --no-fund
# The whole checkout (.dockerignore leaves out node_modules, .git and results): the script picks
# what the image needs.
COPY . .
RUN bash scripts/build-image-tree.sh --runtime "${RUNTIME}" --cni-dir /usr/lib/cni /image \
 && /image/opt/roamguard/bin/roamguard --runtime "${RUNTIME}" genkey >/dev/null

FROM ${NODE_IMAGE}
ARG RUNTIME=node
ENV DEBIAN_FRONTEND=noninteractive
# nft (nftables), ip (iproute2), libsodium (the fastest crypto provider, through FFI), wg (for
# `kubectl exec … wg show`; wireguard-tools without recommends pulls in no kernel module), ping
# (iputils-ping: the agent's DF-set path-MTU probes).
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iproute2 iputils-ping libsodium23 wireguard-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /image/ /
ENV ROAMGUARD_RUNTIME=${RUNTIME} \
    NODE_ENV=production
LABEL org.opencontainers.image.title="roamguard" \
      org.opencontainers.image.description="Userspace WireGuard pod network for Kubernetes nodes behind NAT"
ENTRYPOINT ["/usr/local/bin/roamguard"]
CMD ["agent"]
