package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// A policy generation's series: what Location and Denial handed out since
// the previous Prune. A reload that removes or renames a service, a
// location, a zone or a guard would otherwise leave its series in every
// scrape for the life of the process.

type locKey struct{ service, location string }

type denialKey struct{ kind, name string }

type svcStatus struct {
	service string
	status  int
}

type genSeries struct {
	locs     map[locKey]map[denialKey]struct{}
	services map[string]struct{}
	statuses map[svcStatus]struct{}
}

func newGenSeries() *genSeries {
	return &genSeries{locs: map[locKey]map[denialKey]struct{}{}, services: map[string]struct{}{}, statuses: map[svcStatus]struct{}{}}
}

// location records the series of a service/location pair; m.genMu held.
func (g *genSeries) location(service, location string, denyStatus int) map[denialKey]struct{} {
	g.services[service] = struct{}{}
	if denyStatus != 0 {
		g.statuses[svcStatus{service, denyStatus}] = struct{}{}
	}
	k := locKey{service, location}
	d := g.locs[k]
	if d == nil {
		d = map[denialKey]struct{}{}
		g.locs[k] = d
	}
	return d
}

func (m *Metrics) recordLocation(service, location string, denyStatus int) {
	m.genMu.Lock()
	defer m.genMu.Unlock()
	if m.gen == nil {
		m.gen = newGenSeries()
	}
	m.gen.location(service, location, denyStatus)
}

func (m *Metrics) recordDenial(service, location, kind, name string) {
	m.genMu.Lock()
	defer m.genMu.Unlock()
	if m.gen == nil {
		m.gen = newGenSeries()
	}
	m.gen.location(service, location, 0)[denialKey{kind, name}] = struct{}{}
}

// Prune ends a policy generation: it deletes the series that the previous
// generation's Location and Denial calls created and the new one's did
// not ask for again (the per-location request, admission and denial
// series; per service the report, upstream error, deny answer and
// passthrough connection series), and starts recording the next
// generation. Call it once the new generation's series are resolved.
// A request of the old generation still in flight counts into a deleted
// series: that count is lost, not resurrected.
func (m *Metrics) Prune() {
	m.genMu.Lock()
	defer m.genMu.Unlock()
	cur := m.gen
	if cur == nil {
		cur = newGenSeries()
	}
	if prev := m.prevGen; prev != nil {
		for k, denials := range prev.locs {
			now, kept := cur.locs[k]
			if !kept {
				for _, o := range Outcomes {
					m.requests.DeleteLabelValues(k.service, k.location, o)
				}
				m.admission.DeleteLabelValues(k.service, k.location)
			}
			for d := range denials {
				if _, ok := now[d]; !ok {
					m.denials.DeleteLabelValues(k.service, k.location, d.kind, d.name)
				}
			}
		}
		for s := range prev.statuses {
			if _, ok := cur.statuses[s]; !ok {
				m.denyAnswers.DeleteLabelValues(s.service, strconv.Itoa(s.status))
			}
		}
		for s := range prev.services {
			if _, ok := cur.services[s]; ok {
				continue
			}
			m.reports.DeleteLabelValues(s)
			m.upstreamErrors.DeleteLabelValues(s)
			// Connections are counted per connection, not per generation:
			// whatever a removed service counted goes with it.
			m.connections.DeletePartialMatch(prometheus.Labels{"service": s})
		}
	}
	m.prevGen, m.gen = cur, newGenSeries()
}
