package testkit

import "testing"

func TestGoroutineID(t *testing.T) {
	here := GoroutineID()
	ch := make(chan uint64)
	go func() { ch <- GoroutineID() }()
	there := <-ch
	if here == 0 || there == 0 || here == there || GoroutineID() != here {
		t.Fatalf("ids: here %d (again %d), other goroutine %d", here, GoroutineID(), there)
	}
}
