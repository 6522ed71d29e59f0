package metrics

import "github.com/prometheus/client_golang/prometheus"

func (m *Metrics) registerConnections() {
	m.connections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "passthrough_connections_total",
		Help: "Connections the proxy did not serve as HTTP/1.1 (TLS passthrough, other protocols), " +
			"by service, protocol (tls, other) and how they ended (relayed, rejected, denied, malformed, timeout, upstream_error).",
	}, []string{"service", "protocol", "action"})
	m.Registry.MustRegister(m.connections)
}

// Connection returns the counter of handed-off connections of one
// service, protocol and action.
func (m *Metrics) Connection(service, protocol, action string) prometheus.Counter {
	return m.connections.WithLabelValues(service, protocol, action)
}
