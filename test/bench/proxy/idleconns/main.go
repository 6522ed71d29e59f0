// Command idleconns opens N keep-alive connections to an HTTP server, makes
// one request on each, prints "ready N" and holds them idle until stdin
// closes (test/bench/proxy.sh measures the server's memory meanwhile).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "server address")
	n := flag.Int("n", 10000, "connections")
	par := flag.Int("parallel", 64, "connections opened at once")
	flag.Parse()
	conns := make([]net.Conn, *n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, *par)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", *addr, 10*time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(30 * time.Second))
				_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
			}
			if err == nil {
				var r *http.Response
				r, err = http.ReadResponse(bufio.NewReader(c), nil)
				if err == nil {
					io.Copy(io.Discard, r.Body)
					if r.StatusCode != 200 {
						err = fmt.Errorf("status %d", r.StatusCode)
					}
				}
				c.SetDeadline(time.Time{})
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if c != nil {
					c.Close()
				}
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if firstErr != nil {
		fmt.Fprintln(os.Stderr, "idleconns:", firstErr)
		os.Exit(1)
	}
	fmt.Printf("ready %d\n", len(conns))
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}
