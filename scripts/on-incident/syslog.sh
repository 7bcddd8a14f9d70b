#!/bin/sh
# R2CC_ON_INCIDENT example: one syslog line per incident (tag r2cc, facility user;
# warning for a real repair, notice for a failback or a drill's).
#   R2CC_ON_INCIDENT=/usr/share/r2cc/on-incident/syslog.sh
# R2CC_SYSLOG_SOCKET: a socket to write to instead of /dev/log (logger -u).
set -u
prio=user.warning
[ "$R2CC_INCIDENT_KIND" = repair ] && [ "$R2CC_INCIDENT_DRILL" = 0 ] || prio=user.notice
drill=
[ "$R2CC_INCIDENT_DRILL" = 1 ] && drill=' (drill)'
cat >/dev/null # the JSON is not needed here
exec logger ${R2CC_SYSLOG_SOCKET:+-u "$R2CC_SYSLOG_SOCKET"} -t r2cc -p "$prio" -- \
	"$R2CC_INCIDENT_KIND$drill on $R2CC_INCIDENT_HOST ($R2CC_INCIDENT_NODE) pid $R2CC_INCIDENT_PID:" \
	"NIC $R2CC_INCIDENT_NIC, $R2CC_INCIDENT_MIGRATED of $R2CC_INCIDENT_QPS queue pairs moved," \
	"$R2CC_INCIDENT_FAILED failed, in $R2CC_INCIDENT_MS ms; evidence: $R2CC_INCIDENT_EVIDENCE"
