#!/bin/sh
# dhclient hook (-sf) of a gpulab lab host: sets the leased address on the interface and nothing
# else (no resolv.conf, no hostname, no routes), so the host has no way out of the lab.
case "$reason" in
  PREINIT)
    ip link set "$interface" up
    ;;
  BOUND|RENEW|REBIND|REBOOT)
    if [ -n "$old_ip_address" ] && [ "$old_ip_address" != "$new_ip_address" ]; then
      ip -4 addr flush dev "$interface"
    fi
    if ! ip -4 addr show dev "$interface" | grep -q " $new_ip_address/"; then
      ip -4 addr flush dev "$interface"
      ip -4 addr add "$new_ip_address/$new_subnet_mask" dev "$interface"
    fi
    # the host's sshd listens on its lab address only: follow the address when a renew moved it
    conf=/etc/ssh/gpulab_sshd_config
    if [ -f "$conf" ] && ! grep -q "^ListenAddress $new_ip_address:22\$" "$conf"; then
      sed -i "s/^ListenAddress .*/ListenAddress $new_ip_address:22/" "$conf"
      pkill -HUP -f "sshd -D -e -f $conf" || true
    fi
    ;;
  EXPIRE|FAIL|RELEASE|STOP)
    ip -4 addr flush dev "$interface"
    ;;
esac
exit 0
