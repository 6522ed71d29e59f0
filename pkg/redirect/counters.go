package redirect

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/rl-tproxy/rl-tproxy/bpf"
)

// Counters are the program's per-CPU counters summed over CPUs. Only TCP
// lookups are counted.
type Counters struct {
	Steered     uint64 // assigned to the proxy's listener
	NoSocket    uint64 // steered port but the sockmap slot was empty: passed to the service
	AssignError uint64 // bpf_sk_assign failed: passed to the service
	Bypassed    uint64 // the proxy's own upstream connection: passed
	NotMatched  uint64 // port (or destination prefix) not steered: passed
	Loopback    uint64 // local client while SteerLoopback is off: passed
}

// counterNames maps a counter index to its metric label, in index order.
var counterNames = [...]string{
	bpf.SkLookupCounterCOUNTER_STEERED:      "steered",
	bpf.SkLookupCounterCOUNTER_NO_SOCKET:    "no_socket",
	bpf.SkLookupCounterCOUNTER_ASSIGN_ERROR: "assign_error",
	bpf.SkLookupCounterCOUNTER_BYPASSED:     "bypassed",
	bpf.SkLookupCounterCOUNTER_NOT_MATCHED:  "not_matched",
	bpf.SkLookupCounterCOUNTER_LOOPBACK:     "loopback",
}

func (c *Counters) field(i bpf.SkLookupCounter) *uint64 {
	switch i {
	case bpf.SkLookupCounterCOUNTER_STEERED:
		return &c.Steered
	case bpf.SkLookupCounterCOUNTER_NO_SOCKET:
		return &c.NoSocket
	case bpf.SkLookupCounterCOUNTER_ASSIGN_ERROR:
		return &c.AssignError
	case bpf.SkLookupCounterCOUNTER_BYPASSED:
		return &c.Bypassed
	case bpf.SkLookupCounterCOUNTER_NOT_MATCHED:
		return &c.NotMatched
	case bpf.SkLookupCounterCOUNTER_LOOPBACK:
		return &c.Loopback
	}
	return nil
}

// Values returns the counters with their metric labels, in a fixed order.
func (c Counters) Values() []NamedCounter {
	out := make([]NamedCounter, 0, len(counterNames))
	for i, n := range counterNames {
		out = append(out, NamedCounter{Name: n, Value: *c.field(bpf.SkLookupCounter(i))})
	}
	return out
}

// NamedCounter is one counter and its label.
type NamedCounter struct {
	Name  string
	Value uint64
}

func readCounters(m *ebpf.Map) (Counters, error) {
	var c Counters
	var perCPU []uint64
	for i := range counterNames {
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return Counters{}, fmt.Errorf("read counter %s: %w", counterNames[i], err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		*c.field(bpf.SkLookupCounter(i)) = sum
	}
	return c, nil
}

// Counters reads the program's counters.
func (r *Redirect) Counters() (Counters, error) {
	return readCounters(r.maps.Counters)
}
