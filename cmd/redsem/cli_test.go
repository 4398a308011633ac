//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Bad invocations exit with their documented code and one line on stderr,
// never a stack trace. None of them reaches a Redis.
func TestErrorsAreOneLine(t *testing.T) {
	t.Parallel()
	e := &env{url: "redis://127.0.0.1:1", dir: t.TempDir()} // refuses connections
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, exitUsage},
		{[]string{"bogus"}, exitUsage},
		{[]string{"run"}, exitUsage},
		{[]string{"run", "x"}, exitUsage},
		{[]string{"run", "--bogus", "x", "--", "true"}, exitUsage},
		{[]string{"run", "-n", "2", "x", "--", "true"}, exitUsage},
		{[]string{"run", "--size", "0", "x", "--", "true"}, exitUsage},
		{[]string{"run", "--ttl", "soon", "x", "--", "true"}, exitUsage},
		{[]string{"run", "-E", "300", "x", "--", "true"}, exitUsage},
		{[]string{"run", "-c", "true", "x", "--", "ls"}, exitUsage},
		{[]string{"run", "--redis", "ftp://h", "x", "--", "true"}, exitUsage},
		{[]string{"run", "--redis", "rediss://h", "--cacert", "/nonexistent", "x", "--", "true"}, exitUsage},
		{[]string{"run", "x", "--", "true"}, exitUnavailable},
		{[]string{"status"}, exitUsage},
		{[]string{"status", "a", "b"}, exitUsage},
		{[]string{"status", "a"}, exitUnavailable},
		{[]string{"reclaim", "a"}, exitUnavailable},
		{[]string{"delete", "--force", "a"}, exitUnavailable},
		{[]string{"demo", "--workers", "0"}, exitUsage},
		{[]string{"demo", "extra"}, exitUsage},
		{[]string{"help", "bogus"}, exitUsage},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, tc.code, r.code, "%v: %s", tc.args, r.stderr)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v: one line: %q", tc.args, r.stderr)
		assert.True(t, strings.HasPrefix(r.stderr, "redsem: "), "%v: %q", tc.args, r.stderr)
		assert.NotContains(t, r.stderr, "goroutine", "%v", tc.args)
		assert.Empty(t, r.stdout, "%v", tc.args)
	}
	// An unknown command, and no command at all, are answered with the
	// list of them all.
	for _, args := range [][]string{{"bogus"}, nil} {
		r := e.run(t, args...)
		for name := range commands {
			assert.Contains(t, r.stderr, name, "%v", args)
		}
		assert.Contains(t, r.stderr, commandList, "%v", args)
	}
	assert.Len(t, strings.Split(commandList, ", "), len(commands)+2, "commandList: every command, help and version")
}

func TestHelpForEveryCommand(t *testing.T) {
	t.Parallel()
	e := &env{url: "redis://127.0.0.1:1", dir: t.TempDir()}
	for _, args := range [][]string{
		{"help"}, {"--help"}, {"run", "--help"}, {"run", "-h"}, {"status", "--help"},
		{"reclaim", "--help"}, {"delete", "--help"}, {"demo", "--help"}, {"help", "run"},
		{"resize", "--help"}, {"check", "--help"}, {"repair", "--help"}, {"rate", "--help"}, {"top", "--help"},
		{"elect", "--help"}, {"leader", "--help"},
	} {
		r := e.run(t, args...)
		assert.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stdout, "Usage:", "%v", args)
		assert.Contains(t, r.stdout, "Example", "%v", args)
		assert.Empty(t, r.stderr, "%v", args)
	}
}

// The texts that list the kinds top, check and the exporter show name every
// one, elections included: redsem --help's Kinds paragraph and top line, top
// --help, and the README's fleet paragraph.
func TestHelpNamesEveryKind(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	for what, text := range map[string]string{
		"redsem --help, Kinds:":     paragraphWith(t, mainHelp, "Kinds: "),
		"redsem --help, top line":   paragraphWith(t, lineWith(t, mainHelp, "  redsem top "), "redsem top"),
		"redsem top --help":         paragraphWith(t, topHelp, "A live view of"),
		"README, the fleet's tools": paragraphWith(t, string(readme), "`redsem exporter` (Prometheus"),
	} {
		for _, kind := range []string{"semaphore", "lock", "rate gate", "election"} {
			assert.Contains(t, text, kind, "%s: %q", what, text)
		}
	}
}

// paragraphWith returns the paragraph of text that contains s, its lines
// joined by single spaces.
func paragraphWith(t *testing.T, text, s string) string {
	t.Helper()
	for _, p := range strings.Split(text, "\n\n") {
		if strings.Contains(p, s) {
			return strings.Join(strings.Fields(p), " ")
		}
	}
	t.Fatalf("no paragraph contains %q", s)
	return ""
}

// lineWith returns the line of text that contains s.
func lineWith(t *testing.T, text, s string) string {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("no line contains %q", s)
	return ""
}

// A usage error names the flag and says what is wrong with the value, and a
// mistyped command is answered with the closest one.
func TestUsageErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	e := &env{url: "redis://127.0.0.1:1", dir: t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--size", "0", "x", "--", "true"}, `redsem: run: invalid value "0" for --size: not between 1 and 10000 (see redsem run --help)`},
		{[]string{"run", "--ttl", "5ms", "x", "--", "true"}, `redsem: run: invalid value "5ms" for --ttl: not between 20ms and 168h (see redsem run --help)`},
		{[]string{"run", "--rate", "5/-1s", "x", "--", "true"}, `redsem: run: invalid value "5/-1s" for --rate: not a limit N/PER such as 5/s, 100/1m or 20/250ms: PER must be from 1ms to`},
		{[]string{"stauts", "x"}, `redsem: unknown command "stauts"; did you mean status? commands: `},
		{[]string{"help", "chekc"}, `redsem: help: unknown command "chekc"; did you mean check? commands: `},
		{[]string{"zzz"}, `redsem: unknown command "zzz"; commands: `},
	} {
		r := e.run(t, tc.args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		assert.True(t, strings.HasPrefix(r.stderr, tc.want), "%v:\n got %q\nwant %q...", tc.args, r.stderr, tc.want)
	}
}
