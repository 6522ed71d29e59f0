package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

const (
	unitFile      = "systemd/rl-tproxy.service"
	nginxDropIn   = "systemd/examples/nginx.service.d/10-rl-tproxy.conf"
	installedPath = "/usr/local/bin/rl-tproxy"
	maxExposure   = 3.0 // systemd-analyze security: "OK" is below 4.0
)

// systemdAnalyze returns the systemd-analyze binary (testkit.NeedTool).
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	return testkit.NeedTool(t, "systemd-analyze", "systemd")
}

// stageUnits copies the unit (and optional extra files) into a temp dir,
// pointing ExecStart at an executable stub so `verify` can check that every
// command exists without /usr/local/bin/rl-tproxy being installed. Nothing
// else in the unit changes.
func stageUnits(t *testing.T, unit string, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	stub := filepath.Join(dir, "rl-tproxy")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	unit = strings.ReplaceAll(unit, installedPath, stub)
	if err := os.WriteFile(filepath.Join(dir, "rl-tproxy.service"), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, body := range extra {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(body, "@STUB@", stub)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// verify runs `systemd-analyze verify` on a unit in dir. It works without
// systemd as PID 1 (containers): --man=no skips the Documentation= lookup.
// It returns the exit error and the diagnostics that mention dir (lines
// about units systemd-analyze loads from the host are not ours).
func verify(t *testing.T, bin, dir, unit string, env ...string) (diags []string, out string, err error) {
	t.Helper()
	cmd := exec.Command(bin, "verify", "--man=no", filepath.Join(dir, unit))
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err = cmd.Run()
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.Contains(line, dir) || strings.HasPrefix(line, "rl-tproxy.service:") || strings.HasPrefix(line, "nginx.service:") {
			diags = append(diags, line)
		}
	}
	return diags, buf.String(), err
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSystemdUnitVerifies(t *testing.T) {
	bin := systemdAnalyze(t)
	dir := stageUnits(t, readFile(t, unitFile), nil)
	diags, out, err := verify(t, bin, dir, "rl-tproxy.service")
	if err != nil || len(diags) != 0 {
		t.Fatalf("systemd-analyze verify: err=%v diagnostics=%q\n%s", err, diags, out)
	}
}

// The verify check must be able to fail: a broken copy of the unit is
// rejected by exit status (missing executable) or by a diagnostic.
func TestSystemdVerifyCatchesBreakage(t *testing.T) {
	bin := systemdAnalyze(t)
	unit := readFile(t, unitFile)
	cases := map[string]string{
		"missing executable": strings.Replace(unit, "ExecStart="+installedPath+" ", "ExecStart="+installedPath+"-missing ", 1),
		"unknown key":        strings.Replace(unit, "[Service]\n", "[Service]\nProtectSystemm=strict\n", 1),
		"bad value":          strings.Replace(unit, "ProtectSystem=strict", "ProtectSystem=stricter", 1),
		"bad address family": strings.Replace(unit, "AF_NETLINK", "AF_NETLINKX", 1),
	}
	for name, broken := range cases {
		t.Run(name, func(t *testing.T) {
			if broken == unit {
				t.Fatal("mutation did not apply: the unit changed shape")
			}
			dir := stageUnits(t, broken, nil)
			diags, out, err := verify(t, bin, dir, "rl-tproxy.service")
			if err == nil && len(diags) == 0 {
				t.Fatalf("verify accepted a broken unit:\n%s", out)
			}
			if name == "missing executable" && err == nil {
				t.Fatalf("verify exited 0 on a unit whose ExecStart does not exist:\n%s", out)
			}
		})
	}
}

// unitSettings parses a unit file into section.key -> values (repeated keys
// keep every value).
func unitSettings(text string) map[string][]string {
	m := map[string][]string{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			m[section+"."+k] = append(m[section+"."+k], v)
		}
	}
	return m
}

func TestSystemdUnitContract(t *testing.T) {
	s := unitSettings(readFile(t, unitFile))
	want := map[string]string{
		"Service.ExecStart":               installedPath + " run --policy /etc/rl-tproxy/policy.yaml --log-format json",
		"Service.Restart":                 "on-failure",
		"Service.KillSignal":              "SIGTERM",
		"Service.NoNewPrivileges":         "yes",
		"Service.ProtectSystem":           "strict",
		"Service.ReadWritePaths":          "/sys/fs/bpf",
		"Service.ProtectHome":             "yes",
		"Service.PrivateTmp":              "yes",
		"Service.StateDirectory":          "rl-tproxy",
		"Service.RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX AF_NETLINK",
		"Service.AmbientCapabilities":     "",
		"Unit.RequiresMountsFor":          "/sys/fs/bpf",
		"Install.WantedBy":                "multi-user.target",
	}
	for k, v := range want {
		if got := s[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	var caps []string
	for _, c := range strings.Fields(strings.Join(s["Service.CapabilityBoundingSet"], " ")) {
		caps = append(caps, strings.TrimPrefix(c, "CAP_"))
	}
	slices.Sort(caps)
	if !slices.Equal(caps, wantCaps) {
		t.Errorf("CapabilityBoundingSet %v, want exactly %v (the set capabilities_test.go proves)", caps, wantCaps)
	}
	if r := s["Service.ExecReload"]; len(r) == 0 || r[len(r)-1] != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload must end with SIGHUP to the main process: %q", r)
	}
	if ts := s["Service.TimeoutStopSec"]; len(ts) != 1 || ts[0] == "" || ts[0] == "infinity" {
		t.Errorf("TimeoutStopSec must bound the drain: %q", ts)
	}
}

// systemd-analyze security scores the unit's sandboxing offline; a change
// that weakens it (a dropped Protect*=, a wider capability set) raises the
// score.
func TestSystemdUnitExposure(t *testing.T) {
	bin := systemdAnalyze(t)
	dir := stageUnits(t, readFile(t, unitFile), nil)
	score := func(d string) float64 {
		out, err := exec.Command(bin, "security", "--offline=true", filepath.Join(d, "rl-tproxy.service")).CombinedOutput()
		if err != nil {
			testkit.Missing(t, "needs systemd-analyze security --offline (systemd >= 250): %v\n%s", err, out)
		}
		const marker = "Overall exposure level for rl-tproxy.service: "
		i := bytes.Index(out, []byte(marker))
		if i < 0 {
			t.Fatalf("no exposure level in:\n%s", out)
		}
		f, err := strconv.ParseFloat(strings.Fields(string(out[i+len(marker):]))[0], 64)
		if err != nil {
			t.Fatalf("exposure level: %v", err)
		}
		return f
	}
	got := score(dir)
	t.Logf("systemd-analyze security exposure: %.1f", got)
	if got > maxExposure {
		t.Errorf("exposure %.1f above %.1f", got, maxExposure)
	}
	weak := strings.NewReplacer("ProtectSystem=strict\n", "", "NoNewPrivileges=yes\n", "",
		"CapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN\n", "", "PrivateDevices=yes\n", "").Replace(readFile(t, unitFile))
	if w := score(stageUnits(t, weak, nil)); w <= got {
		t.Errorf("weakened unit scored %.1f, not worse than %.1f: the score check cannot fail", w, got)
	}
}

// The nginx drop-in must load beside a stand-in nginx.service, add the
// dependency on rl-tproxy.service and order nginx first, with no
// diagnostics; systemd's debug dump shows what it actually applied.
func TestNginxDropInVerifies(t *testing.T) {
	bin := systemdAnalyze(t)
	dir := stageUnits(t, readFile(t, unitFile), map[string]string{
		"nginx.service":                     "[Unit]\nDescription=stand-in for Debian's nginx.service\n[Service]\nExecStart=@STUB@\n",
		"nginx.service.d/10-rl-tproxy.conf": readFile(t, nginxDropIn),
	})
	diags, out, err := verify(t, bin, dir, "nginx.service")
	if err != nil || len(diags) != 0 {
		t.Fatalf("verify nginx.service with the drop-in: err=%v diagnostics=%q\n%s", err, diags, out)
	}
	_, dump, _ := verify(t, bin, dir, "nginx.service", "SYSTEMD_LOG_LEVEL=debug")
	for _, want := range []string{
		"DropIn Path: " + filepath.Join(dir, "nginx.service.d/10-rl-tproxy.conf"),
		"Wants: rl-tproxy.service",
		"Before: rl-tproxy.service",
		"normal unit file: " + filepath.Join(dir, "rl-tproxy.service"),
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("systemd did not apply %q; debug dump:\n%s", want, lastLines(dump, 60))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprint(strings.Join(lines, "\n"))
}
