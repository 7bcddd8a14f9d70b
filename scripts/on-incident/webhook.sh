#!/bin/sh
# R2CC_ON_INCIDENT example: posts the incident's JSON (standard input) to a webhook.
#   R2CC_ON_INCIDENT="R2CC_WEBHOOK_URL=https://hooks.example/r2cc /usr/share/r2cc/on-incident/webhook.sh"
# R2CC_WEBHOOK_URL: where to post (required). The body is the incident as the exit
# report has it, with "host", "node" and "pid" added in an envelope:
#   {"host":..., "node":..., "pid":..., "kind":"repair|failback", "drill":0|1, "incident":{...}}
# curl gives up after 5 s (R2CC kills the command after R2CC_ON_INCIDENT_TIMEOUT_MS).
set -u
: "${R2CC_WEBHOOK_URL:?set R2CC_WEBHOOK_URL}"
{
	printf '{"host":"%s","node":"%s","pid":%s,"kind":"%s","drill":%s,"incident":' \
		"$R2CC_INCIDENT_HOST" "$R2CC_INCIDENT_NODE" "$R2CC_INCIDENT_PID" \
		"$R2CC_INCIDENT_KIND" "$R2CC_INCIDENT_DRILL"
	cat
	printf '}\n'
} | curl -fsS -m 5 -H 'Content-Type: application/json' --data-binary @- "$R2CC_WEBHOOK_URL"
