package node

import (
	"os"
	"os/signal"
	"syscall"
)

// signals are the process signals `run` and `demo` react to: SIGHUP
// reloads, SIGTERM and SIGINT drain and exit.
type signals struct {
	hup, term chan os.Signal
}

func notifySignals() *signals {
	s := &signals{hup: make(chan os.Signal, 1), term: make(chan os.Signal, 2)}
	signal.Notify(s.hup, syscall.SIGHUP)
	signal.Notify(s.term, syscall.SIGTERM, syscall.SIGINT)
	return s
}

func (s *signals) stop() {
	signal.Stop(s.hup)
	signal.Stop(s.term)
}
