#!/bin/sh
# The extender's TLS files: a CA of its own and a server certificate signed by it whose subject
# alternative names are the Service's DNS names (kube-scheduler checks the one in its tlsConfig's
# serverName). Writes ca.crt, ca.key, tls.crt and tls.key into DIR (made if missing); needs
# openssl. NAMESPACE and SERVICE default to the manifests' verwalter and verwalter-extender.
#
#   deploy/kubernetes/make-tls.sh DIR
set -eu
dir=${1:?usage: make-tls.sh DIR}
ns=${NAMESPACE:-verwalter}
svc=${SERVICE:-verwalter-extender}
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -subj "/CN=$svc CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$svc.$ns.svc" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s,DNS:%s,DNS:%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=critical,CA:FALSE\n' \
    "$svc" "$svc.$ns" "$svc.$ns.svc" "$svc.$ns.svc.cluster.local" > "$dir/tls.ext"
openssl x509 -req -sha256 -days "$days" -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext" "$dir/ca.srl"
chmod 644 "$dir/ca.crt" "$dir/tls.crt"
echo "$dir: ca.crt ca.key tls.crt tls.key for $svc.$ns.svc"
