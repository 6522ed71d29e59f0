package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

func (m *Metrics) registerRejections() {
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "rejections_total",
		Help: "Requests the proxy answered itself under a protocol rule (400, 408, 413, 414, 417, 431, 501, 505), " +
			"by status and reason (the rule: bad-request-line, header-timeout, body-too-large, ...).",
	}, []string{"status", "reason"})
	m.Registry.MustRegister(m.rejections)
}

type rejectKey struct {
	status int
	reason string
}

// Rejection returns the counter of requests the proxy answered itself with
// status for reason. Counters are cached: a flood of rejections costs a map
// lookup each, not a label hash and a string conversion.
func (m *Metrics) Rejection(status int, reason string) prometheus.Counter {
	k := rejectKey{status, reason}
	if c, ok := m.rejectCounters.Load(k); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.rejectCounters.LoadOrStore(k, m.rejections.WithLabelValues(strconv.Itoa(status), reason))
	return c.(prometheus.Counter)
}
