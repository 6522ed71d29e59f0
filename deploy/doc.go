// Package deploy holds rl-tproxy's deployment artefacts (Kubernetes
// manifests under kubernetes/, the systemd unit and drop-ins under systemd/,
// Prometheus configuration under prometheus/, the Grafana dashboard under
// grafana/) and the tests that verify them; it has no code of its own.
package deploy
