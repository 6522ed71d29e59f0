// Command latclient is the latency benchmark's client (test/bench/latency.sh):
// C connections, each sending one GET at a time and timing every request
// on its own, from the first byte written (or the connect, with -new) to
// the last byte of the response. Unlike wrk it synthesises nothing for
// coordinated omission: every sample is a request that really ran, so a
// stall shows as the requests it delayed, no more, no fewer.
//
// It understands what the benchmark's servers answer: a status line,
// header fields, and a body framed by Content-Length, chunked coding, or
// the end of the connection. Bench use only.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

func main() {
	target := flag.String("url", "", "http://host:port/path to GET")
	conns := flag.Int("c", 1, "connections, each with one request at a time")
	dur := flag.Duration("d", 5*time.Second, "how long to send requests")
	maxN := flag.Int("n", 2_000_000, "stop after this many requests in all, answered or failed (a bound on the run)")
	fresh := flag.Bool("new", false, "a new connection per request (Connection: close), timed from the connect")
	timeout := flag.Duration("timeout", 10*time.Second, "give up on one request after this long (counted as an error)")
	flag.Parse()
	if *target == "" || *conns < 1 || *dur <= 0 || *maxN < 1 {
		fmt.Fprintln(os.Stderr, "latclient: -url is required; -c, -d and -n must be positive")
		os.Exit(1)
	}
	u, err := url.Parse(*target)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(os.Stderr, "latclient: -url %q: want http://host:port/path\n", *target)
		os.Exit(1)
	}
	path := u.RequestURI()
	conn := "keep-alive"
	if *fresh {
		conn = "close"
	}
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nConnection: " + conn + "\r\n\r\n")

	per := *maxN / *conns
	if per < 1 {
		per = 1
	}
	res := make([]result, *conns)
	var wg sync.WaitGroup
	end := time.Now().Add(*dur)
	start := time.Now()
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = run(u.Host, req, *fresh, end, per, *timeout)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	errs := 0
	var firstErr error
	for _, r := range res {
		all = append(all, r.lat...)
		errs += r.errs
		if firstErr == nil {
			firstErr = r.err
		}
	}
	if len(all) == 0 {
		fmt.Fprintf(os.Stderr, "latclient: no request completed (%d errors; first: %v)\n", errs, firstErr)
		os.Exit(2)
	}
	slices.Sort(all)
	ms := func(q float64) float64 { return float64(quantile(all, q)) / 1e6 }
	// One line, fields by name, for latency.sh.
	fmt.Printf("requests=%d errors=%d rps=%.0f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f\n",
		len(all), errs, float64(len(all))/elapsed.Seconds(), ms(0.50), ms(0.90), ms(0.99), ms(0.999), float64(all[len(all)-1])/1e6)
	if errs > 0 {
		fmt.Fprintf(os.Stderr, "latclient: %d requests failed; first: %v\n", errs, firstErr)
	}
}

// quantile is the nearest-rank q-quantile of sorted samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

type result struct {
	lat  []time.Duration
	errs int
	err  error
}

// run sends requests on one connection (or one connection per request)
// until end or n attempts (answered or failed).
func run(addr string, req []byte, fresh bool, end time.Time, n int, timeout time.Duration) result {
	r := result{lat: make([]time.Duration, 0, min(n, 1<<20))}
	var c net.Conn
	var br *bufio.Reader
	fail := func(err error) {
		r.errs++
		if r.err == nil {
			r.err = err
		}
		if c != nil {
			c.Close()
			c = nil
		}
	}
	for len(r.lat)+r.errs < n && time.Now().Before(end) {
		t0 := time.Now()
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", addr, timeout); err != nil {
				fail(err)
				continue
			}
			if br == nil {
				br = bufio.NewReaderSize(c, 64<<10)
			} else {
				br.Reset(c)
			}
		}
		c.SetDeadline(t0.Add(timeout))
		if _, err := c.Write(req); err != nil {
			fail(fmt.Errorf("write: %w", err))
			continue
		}
		closes, err := readResponse(br)
		if err != nil {
			fail(err)
			continue
		}
		r.lat = append(r.lat, time.Since(t0))
		if fresh || closes {
			c.Close()
			c = nil
		}
	}
	if c != nil {
		c.Close()
	}
	return r
}

var (
	errStatus  = errors.New("malformed status line")
	errLength  = errors.New("malformed Content-Length")
	errChunk   = errors.New("malformed chunk size")
	errNotOK   = errors.New("status is not 2xx")
	errTooLong = errors.New("header line over 64 KiB")
)

// readResponse reads one response to a GET and reports whether the
// server closes the connection after it.
func readResponse(br *bufio.Reader) (closes bool, err error) {
	line, err := readLine(br)
	if err != nil {
		return false, fmt.Errorf("status line: %w", err)
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return false, fmt.Errorf("%w: %q", errStatus, line)
	}
	if line[9] != '2' {
		return false, fmt.Errorf("%w: %q", errNotOK, line)
	}
	closes = line[7] == '0'
	length, chunked := int64(-1), false
	for {
		h, err := readLine(br)
		if err != nil {
			return false, fmt.Errorf("header: %w", err)
		}
		if len(h) == 0 {
			break
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil || length < 0 {
				return false, fmt.Errorf("%w: %q", errLength, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closes = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		return closes, readChunked(br)
	case length >= 0:
		_, err = br.Discard(int(length))
		return closes, err
	}
	_, err = io.Copy(io.Discard, br) // delimited by the end of the connection
	return true, err
}

func readChunked(br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return fmt.Errorf("chunk size: %w", err)
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("%w: %q", errChunk, line)
		}
		if size == 0 {
			for { // trailer fields up to the empty line
				t, err := readLine(br)
				if err != nil || len(t) == 0 {
					return err
				}
			}
		}
		if _, err := br.Discard(int(size)); err != nil {
			return err
		}
		if _, err := readLine(br); err != nil {
			return err
		}
	}
}

// readLine returns one line without its CRLF (or LF); valid until the
// next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, errTooLong
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}
