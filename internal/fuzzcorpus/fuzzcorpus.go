// Package fuzzcorpus keeps a committed fuzz seed corpus (testdata/fuzz/NAME)
// in step with the seeds a package's tests generate.
package fuzzcorpus

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// WriteEnv names the environment variable that makes Sync rewrite the
// committed corpus instead of checking it.
const WriteEnv = "RL_WRITE_CORPUS"

// Encode is the go test fuzz v1 file for one []byte seed.
func Encode(seed []byte) []byte {
	return []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(seed)) + ")\n")
}

// Sync checks that testdata/fuzz/target/seedN holds seeds[N] for every N,
// or writes them when RL_WRITE_CORPUS=1. Other files in the directory
// (inputs a fuzzer found and that were committed) are left alone.
func Sync(t testing.TB, target string, seeds [][]byte) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	write := os.Getenv(WriteEnv) == "1"
	if write {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range seeds {
		path := filepath.Join(dir, fmt.Sprintf("seed%d", i))
		want := Encode(s)
		if write {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not the generated seed (err %v): run %s=1 go test -run %s to rewrite the corpus", path, err, WriteEnv, t.Name())
		}
	}
}
