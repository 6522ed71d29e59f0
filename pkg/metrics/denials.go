package metrics

import "github.com/prometheus/client_golang/prometheus"

// Denial kinds (label `kind` of rl_tproxy_denials_total).
const (
	DenialZone  = "zone"
	DenialGuard = "guard"
)

func (m *Metrics) registerDenials() {
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "denials_total",
		Help: "What denied: each zone that was short and each guard (by tracker) that failed in a deny " +
			"(valid RateLimitly deny, shadow would-deny, local-bucket deny), by service, location, kind and name.",
	}, []string{"service", "location", "kind", "name"})
	m.Registry.MustRegister(m.denials)
}

// Denial returns the counter of one zone or guard (kind DenialZone or
// DenialGuard) of a location; resolve it once per policy generation
// (Prune).
func (m *Metrics) Denial(service, location, kind, name string) prometheus.Counter {
	m.recordDenial(service, location, kind, name)
	return m.denials.WithLabelValues(service, location, kind, name)
}
