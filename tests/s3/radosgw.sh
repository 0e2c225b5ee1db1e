#!/usr/bin/env bash
# A throw-away S3 server for the tests: one Ceph monitor, one OSD keeping its objects in
# memory, and radosgw, all on 127.0.0.1, all state under one folder.
#
#   radosgw.sh start DIR   wipes DIR, starts the three daemons, creates an S3 user, and
#                          writes DIR/s3.env (S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY)
#   radosgw.sh stop DIR    stops what start started (by the pids it recorded)
#
# Ports: RGW_PORT (7480), MON_PORT (6789, messenger v1 only). Start-up takes 2-4 s.
set -euo pipefail

action=${1:?usage: radosgw.sh start|stop DIR}
dir=${2:?usage: radosgw.sh start|stop DIR}
rgw_port=${RGW_PORT:-7480}
mon_port=${MON_PORT:-6789}
access=NEFFCACHETESTKEY0001
secret=neffcache-test-secret-0000000000000000001

stop_all() {
  local name pid
  for name in rgw osd mon; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

# until SECONDS WHAT COMMAND...: retries COMMAND every 0.2 s; on time-out prints the logs.
until_ok() {
  local deadline=$(( $(date +%s) + $1 )) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "radosgw.sh: $what did not happen; the last log lines:" >&2
      tail -n 20 "$dir"/log/* >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

if [ "$action" = stop ]; then
  [ -d "$dir" ] && stop_all
  exit 0
fi
[ "$action" = start ] || { echo "usage: radosgw.sh start|stop DIR" >&2; exit 2; }

[ -d "$dir" ] && stop_all
rm -rf "$dir"
mkdir -p "$dir"/{mon,osd,rgw,log}
trap 'stop_all' ERR
export CEPH_CONF=$dir/ceph.conf
fsid=$(uuidgen)
cat >"$CEPH_CONF" <<CONF
[global]
fsid = $fsid
mon_host = v1:127.0.0.1:$mon_port
public_addr = 127.0.0.1
public_network = 127.0.0.1/32
ms_bind_ipv6 = false
run_dir = $dir
admin_socket = $dir/\$name.asok
log_file = $dir/log/\$name.log
# One OSD: every pool keeps one copy and needs no other host.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mon_data_avail_warn = 1
mon_data_avail_crit = 0
# Without these two the OSD takes 13-17 s to come up instead of 2.
paxos_propose_interval = 0.05
osd_mon_report_interval = 1
[mon]
mon_data = $dir/mon/\$id
[osd]
osd_data = $dir/osd/\$id
osd_objectstore = memstore
memstore_device_bytes = 8589934592
[client.rgw]
keyring = $dir/rgw/keyring
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port
rgw_thread_pool_size = 128
[client.admin]
keyring = $dir/admin.keyring
CONF

ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$dir/admin.keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/admin.keyring" >/dev/null
monmaptool --create --fsid "$fsid" --addv a "v1:127.0.0.1:$mon_port" "$dir/monmap" >/dev/null
ceph-mon -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
ceph-mon -i a -f >"$dir/log/mon.out" 2>&1 &
echo $! >"$dir/mon.pid"
until_ok 60 "the monitor's quorum" ceph --connect-timeout 5 mon stat

osd_uuid=$(uuidgen)
osd_key=$(ceph-authtool --gen-print-key)
printf '{"cephx_secret": "%s"}' "$osd_key" >"$dir/osd/secret.json"
[ "$(ceph osd new "$osd_uuid" -i "$dir/osd/secret.json")" = 0 ]
mkdir -p "$dir/osd/0"
ceph-osd -i 0 --mkfs --osd-uuid "$osd_uuid" --key "$osd_key" >"$dir/log/osd-mkfs.out" 2>&1
printf '[osd.0]\nkey = %s\n' "$osd_key" >"$dir/osd/0/keyring"
ceph-osd -i 0 -f >"$dir/log/osd.out" 2>&1 &
echo $! >"$dir/osd.pid"
until_ok 120 "osd.0 up" bash -c 'ceph --connect-timeout 5 osd dump | grep -q "^osd.0 up"'

ceph auth get-or-create client.rgw mon 'allow rw' osd 'allow rwx' -o "$dir/rgw/keyring"
radosgw -n client.rgw --rgw-data "$dir/rgw" -f >"$dir/log/rgw.out" 2>&1 &
echo $! >"$dir/rgw.pid"
until_ok 120 "radosgw answering on port $rgw_port" curl -sf -o /dev/null "http://127.0.0.1:$rgw_port/"
radosgw-admin user create --uid=neffcache --display-name=neffcache-tests \
  --access-key="$access" --secret-key="$secret" >"$dir/log/user.json"
cat >"$dir/s3.env" <<ENV
S3_ENDPOINT=http://127.0.0.1:$rgw_port
S3_ACCESS_KEY=$access
S3_SECRET_KEY=$secret
ENV
# The new user is known once a signed request succeeds (curl 7.88 does not send the
# payload hash header its signature covers, so it is given by hand).
until_ok 30 "a signed request accepted" curl -sf -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 \
  -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --user "$access:$secret" "http://127.0.0.1:$rgw_port/"
echo "radosgw.sh: S3 on http://127.0.0.1:$rgw_port (credentials in $dir/s3.env)"
