package redistest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// recordingTB is a testing.TB that records how the test would have ended.
type recordingTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recordingTB) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(r)
}

// toolOutcome runs Tool for name on a recordingTB.
func toolOutcome(t *testing.T, name string) (path string, rec *recordingTB) {
	rec = &recordingTB{TB: t}
	defer func() {
		if p := recover(); p != nil && p != rec {
			panic(p)
		}
	}()
	return Tool(rec, name, "install it"), rec
}

// A tool a test needs and PATH lacks skips the test, except under
// REDSEM_REQUIRE_REDIS=1 (CI), where it fails it: CI must not pass by
// testing less (TestTopUnderPTY without script(1)).
func TestToolMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(RequireEnv, "")
	_, rec := toolOutcome(t, "script")
	assert.NotEmpty(t, rec.skipped, "without %s: a skip", RequireEnv)
	assert.Empty(t, rec.failed)

	t.Setenv(RequireEnv, "1")
	_, rec = toolOutcome(t, "script")
	assert.Contains(t, rec.failed, "install it", "with %s=1: a failure that says how to install it", RequireEnv)
	assert.Empty(t, rec.skipped)
}

// A tool on PATH is found.
func TestToolPresent(t *testing.T) {
	t.Setenv(RequireEnv, "1")
	path, rec := toolOutcome(t, "sh")
	assert.NotEmpty(t, path)
	assert.Empty(t, rec.failed)
	assert.Empty(t, rec.skipped)
}
