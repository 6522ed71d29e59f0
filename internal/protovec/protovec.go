// Package protovec holds the RateLimitly wire v1 conformance vectors
// (docs/protocol-vectors/*.json): how they are generated from hand-written
// expectations, and how a test loads them. The reference server
// (pkg/rlserver) and client (pkg/rlclient) replay them in their tests; a
// third-party implementation can replay the JSON files without reading Go.
package protovec

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// Vector is one scenario: for a server, datagrams in order with the answer
// or drop each must produce and the bucket state after them; for a client,
// the request it must send and how it must treat each possible answer.
type Vector struct {
	Name        string       `json:"name"`
	Description string       `json:"description"`
	Role        string       `json:"role"` // "server" or "client"
	Credentials []Credential `json:"credentials"`

	// Server vectors.
	ServerStartMs uint64 `json:"server_start_ms,omitempty"` // the server's clock at start: its server_epoch
	Steps         []Step `json:"steps,omitempty"`
	StateAfter    *State `json:"state_after,omitempty"`

	// Client vectors.
	Policy         *Policy      `json:"policy,omitempty"`
	NowMs          uint64       `json:"now_ms,omitempty"`           // the client's clock during every case
	RequestID      string       `json:"request_id,omitempty"`       // 16 hex digits
	RequestBodyHex string       `json:"request_body_hex,omitempty"` // the RATE_REQUEST body the client sends (attempt 0)
	Cases          []ClientCase `json:"cases,omitempty"`
}

// Credential is one key: the server holds all of a vector's credentials,
// the client uses the first.
type Credential struct {
	Tenant       string `json:"tenant"`
	KeyID        uint32 `json:"key_id"`
	SecretHex    string `json:"secret_hex"`
	MaxHorizonMs uint32 `json:"max_horizon_ms,omitempty"` // 0 = none
}

// Step is one datagram delivered to the server at AtMs (server clock).
// Expect is "answer" (a RATE_RESPONSE, see Answer), "none" (accepted,
// never answered: reports, completions) or "drop" (dropped without an
// answer; DropReason names the reference server's rlserver_drops_total
// reason, informative for other servers).
type Step struct {
	Comment     string  `json:"comment"`
	AtMs        uint64  `json:"at_ms"`
	DatagramHex string  `json:"datagram_hex"`
	Expect      string  `json:"expect"`
	DropReason  string  `json:"drop_reason,omitempty"`
	Answer      *Answer `json:"answer,omitempty"`
}

// Answer is the expected RATE_RESPONSE: every header field but the nonce
// (random) and the plaintext body, byte for byte.
type Answer struct {
	Flags       uint8  `json:"flags"`
	Attempt     uint8  `json:"attempt"`
	TTLms       uint16 `json:"ttl_ms"`
	KeyID       uint32 `json:"key_id"`
	RequestID   string `json:"request_id"`
	TimestampMs uint64 `json:"timestamp_ms"`
	BodyHex     string `json:"body_hex"`
}

// State is the server state after the last step.
type State struct {
	Buckets []BucketState `json:"buckets"`
}

// BucketState is a bucket's tokens as of its last use (refill is lazy).
type BucketState struct {
	Tenant string  `json:"tenant"`
	Bucket string  `json:"bucket"`
	Tokens float64 `json:"tokens"`
}

// Policy is the client's request policy.
type Policy struct {
	Name   string `json:"name"`
	UnitMs int    `json:"unit_ms"`
}

// ClientCase is one answer the client receives to its request (sent to a
// single endpoint). Expect is "valid" (a decision: Cause is allow or a
// deny cause), "not_valid" (the server answered but has no valid answer:
// it stays missing, gets the replay, and Cause is the failure when every
// answer is like this), or "drop" (ignored; DropReason names the reference
// client's rl_tproxy_ratelimitly_datagrams_dropped_total reason).
//
// For "not_valid", the replay is answered with ReplayAnswerHex, or with
// AnswerHex again (an attempt-0 answer) when it is empty: either way the
// endpoint has then answered the replay and, with no valid answer, the
// check fails at once with Cause. For "drop", Cause is the failure when
// nothing else arrives until the horizon (3U).
type ClientCase struct {
	Name            string `json:"name"`
	Comment         string `json:"comment,omitempty"`
	AnswerHex       string `json:"answer_hex"`
	ReplayAnswerHex string `json:"replay_answer_hex,omitempty"`
	Expect          string `json:"expect"`
	Cause           string `json:"cause,omitempty"`
	DropReason      string `json:"drop_reason,omitempty"`
}

// Secret decodes the credential's secret.
func (c Credential) Secret() ([32]byte, error) {
	var s [32]byte
	b, err := hex.DecodeString(c.SecretHex)
	if err != nil || len(b) != 32 {
		return s, fmt.Errorf("credential %d: secret_hex: want 64 hex digits", c.KeyID)
	}
	copy(s[:], b)
	return s, nil
}

// ParseID decodes a 16-hex-digit request id.
func ParseID(s string) (uint64, error) { return strconv.ParseUint(s, 16, 64) }

// Load reads every *.json vector in dir, sorted by file name.
func Load(dir string) ([]Vector, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Vector
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("protocol vectors: %w", err)
		}
		var v Vector
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("protocol vectors %s: %w", f, err)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("protocol vectors: no *.json in %s", dir)
	}
	return out, nil
}
