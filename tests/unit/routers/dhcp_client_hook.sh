#!/bin/sh
# dhclient hook for the router tests: configures only eth0 inside the client's own network
# namespace. No resolv.conf, hostname or routes, so nothing outside the namespace changes.
[ -n "$GT4_LOG" ] && echo "$reason ${new_ip_address:-} ${old_ip_address:-}" >> "$GT4_LOG"
case "$reason" in
  PREINIT)
    ip link set dev "$interface" up ;;
  BOUND|RENEW|REBIND|REBOOT)
    if [ -n "$old_ip_address" ] && [ "$old_ip_address" != "$new_ip_address" ]; then
      ip -4 addr flush dev "$interface"
    fi
    ip -4 addr replace "$new_ip_address/${new_subnet_mask:-255.255.255.0}" dev "$interface" ;;
  EXPIRE|FAIL|RELEASE|STOP)
    ip -4 addr flush dev "$interface" ;;
esac
exit 0
