#!/bin/sh
# Start one sentinel of the compose `sentinel` profile: a writable copy of the shared
# config with this sentinel's own name and the primary's password, which stays out of `ps`.
set -eu
conf=/data/sentinel.conf
cp /etc/toolfleet/sentinel.conf "$conf"
printf 'sentinel announce-ip %s\n' "$SENTINEL_HOSTNAME" >> "$conf"
printf 'sentinel auth-pass toolfleet %s\n' "$REDIS_PASSWORD" >> "$conf"
exec redis-server "$conf" --sentinel
