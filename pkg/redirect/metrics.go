package redirect

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descConnections = prometheus.NewDesc("rl_tproxy_redirect_lookups_total",
		"TCP socket lookups seen by the sk_lookup program, by result (steered, no_socket, assign_error, bypassed, not_matched, loopback).",
		[]string{"result"}, nil)
	descListeners = prometheus.NewDesc("rl_tproxy_redirect_listener_slots",
		"Sockmap slots holding a proxy listener (by family); 0 means steered connections fall through to the service.",
		[]string{"family"}, nil)
	descScrapeErrors = prometheus.NewDesc("rl_tproxy_redirect_scrape_errors",
		"1 when the redirect maps could not be read during this scrape.", nil, nil)
)

// Collector exports the program's counters and sockmap occupancy.
func (r *Redirect) Collector() prometheus.Collector { return collector{r} }

type collector struct{ r *Redirect }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConnections
	ch <- descListeners
	ch <- descScrapeErrors
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	failed := 0.0
	cnt, err := c.r.Counters()
	if err != nil {
		failed = 1
	} else {
		for _, nc := range cnt.Values() {
			ch <- prometheus.MustNewConstMetric(descConnections, prometheus.CounterValue, float64(nc.Value), nc.Name)
		}
	}
	for _, s := range []struct {
		slot   uint32
		family string
	}{{SlotIPv4, "ipv4"}, {SlotIPv6, "ipv6"}} {
		var cookie uint64
		v := 0.0
		if c.r.maps.Sockets.Lookup(s.slot, &cookie) == nil {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descListeners, prometheus.GaugeValue, v, s.family)
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErrors, prometheus.GaugeValue, failed)
}
