# Sourced by the build stages of docker/*.Dockerfile before pip or npm runs: a CA bundle staged here
# (ca-bundle.crt, for networks that intercept TLS) becomes pip's trust store and one node trusts. The wheelhouse
# (wheels/) is on PIP_FIND_LINKS already. Neither ever reaches a final image.
if [ -s /tmp/build-inputs/ca-bundle.crt ]; then
    export PIP_CERT=/tmp/build-inputs/ca-bundle.crt
    export NODE_EXTRA_CA_CERTS=/tmp/build-inputs/ca-bundle.crt
fi
mkdir -p /tmp/build-inputs/wheels
