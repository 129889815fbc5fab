#!/usr/bin/env bash
# Runs the Kubernetes example from CI: starts the coordinator Job (with its Service and report
# claim) and the workers Job, waits for the coordinator to end, prints its terminal report,
# copies report.json, report.html and report.md into OUT_DIR through deploy/k8s/collect.yaml,
# and exits with the coordinator's exit code (0 every goal held, 1 a goal failed, ...).
#
#   deploy/k8s/run-ci.sh [OUT_DIR]        (default: ./reports; kubectl on the namespace)
#
# Needs the secret `llm-replay` and the ConfigMap `llm-replay-recording` described at the top
# of deploy/k8s/coordinator.yaml. LLM_REPLAY_K8S_PATIENCE (seconds, default 3600) bounds the
# wait. Clean up with `kubectl delete -f deploy/k8s/`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-reports}"
patience="${LLM_REPLAY_K8S_PATIENCE:-3600}"

# Jobs cannot be re-applied over a finished one: remove the last run's first.
kubectl delete -f "$here/collect.yaml" -f "$here/workers.yaml" --ignore-not-found --wait=true
kubectl delete job llm-replay-coordinator --ignore-not-found --wait=true
kubectl apply -f "$here/coordinator.yaml" -f "$here/workers.yaml"

deadline=$((SECONDS + patience))
while :; do
  state="$(kubectl get job llm-replay-coordinator \
    -o jsonpath='{.status.succeeded}/{.status.failed}')"
  case "$state" in 1/*|*/1) break ;; esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "run-ci.sh: the coordinator did not end within ${patience}s" >&2
    kubectl logs job/llm-replay-coordinator --tail=50 >&2 || true
    exit 3
  fi
  sleep 5
done
kubectl logs job/llm-replay-coordinator
code="$(kubectl get pods -l app.kubernetes.io/name=llm-replay-coordinator \
  -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.exitCode}')"

trap 'kubectl delete -f "$here/collect.yaml" --ignore-not-found --wait=false' EXIT
kubectl apply -f "$here/collect.yaml"
kubectl wait --for=condition=Ready pod/llm-replay-collect --timeout=300s
mkdir -p "$out"
for name in report.json report.html report.md; do
  # A run that failed before any load (exit 2) wrote no report: copy what exists.
  kubectl cp "llm-replay-collect:/reports/$name" "$out/$name" || true
done
echo "run-ci.sh: coordinator exited $code; reports in $out/"
exit "${code:-3}"
