package faults

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// Fault 3: CLIENT KILL of the library's connections: waiters blocked in
// BLMOVE and holders' connections (in use or pooled) mid-run.
func TestClientKill(t *testing.T) {
	t.Parallel()
	const n = 2
	srv := redistest.Start(t)
	r := newRun(t, srv, n, time.Second, 300*time.Millisecond, "-histname")
	runFor := scaled(6*time.Second, 10)
	for i := 0; i < 6; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "10ms", "-holdmax", "80ms")
	}
	admin, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Do("CLIENT", "SETNAME", "admin")
	require.NoError(t, err)
	kills := map[string]int{}
	end := time.Now().Add(runFor - 500*time.Millisecond)
	for i := 0; time.Now().Before(end) && i < 10000; i++ {
		time.Sleep(time.Duration(30+rand.IntN(120)) * time.Millisecond)
		var blocked, other []map[string]string
		for _, c := range clientList(t, admin) {
			if c["name"] == "hist" || c["name"] == "admin" || c["id"] == "" {
				continue
			}
			if c["cmd"] == "blmove" || strings.Contains(c["flags"], "b") {
				blocked = append(blocked, c)
			} else {
				other = append(other, c)
			}
		}
		pick := func(kind string, cs []map[string]string) {
			if len(cs) == 0 {
				return
			}
			c := cs[rand.IntN(len(cs))]
			if _, err := admin.Do("CLIENT", "KILL", "ID", c["id"]); err == nil {
				kills[kind]++
			}
		}
		if i%2 == 0 {
			pick("blocked waiter", blocked)
		} else {
			pick("holder or idle", other)
		}
	}
	r.waitAll(40 * time.Second)
	rep := r.check(history.Options{})
	_, lost, _ := quiesce(t, r.ops(), r.sem(), 15*time.Second)
	t.Logf("CLIENT KILL: clients=%d kills=%v %s; tokens lost=%d", len(r.procs), kills, rep.Summary(), lost)
	assert.Positive(t, kills["blocked waiter"], "no blocked waiter was killed")
}

// Fault 4: context-cancellation storms from several processes at once, next
// to clients that never cancel and must not starve.
func TestCancellationStorm(t *testing.T) {
	t.Parallel()
	const n = 2
	srv := redistest.Start(t)
	r := newRun(t, srv, n, time.Second, 300*time.Millisecond)
	runFor := scaled(6*time.Second, 10)
	for i := 0; i < 6; i++ {
		r.spawn("-dur", runFor.String(), "-storm", "-stormmax", "40ms", "-holdmin", "5ms", "-holdmax", "40ms", "-gapmax", "2ms")
	}
	for i := 0; i < 2; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "5ms", "-holdmax", "20ms", "-acqtimeout", "10s")
	}
	r.waitAll(40 * time.Second)
	evs := r.events()
	rep := r.check(history.Options{})
	sem := r.sem()
	st, lost, _ := quiesce(t, r.ops(), sem, 15*time.Second)
	assert.Zero(t, st.Waiting, "waiters still registered after the storm")
	assert.Empty(t, pendKeys(t, srv, history.KeysFor("redsem:", r.name)), "pending lists left")
	t.Logf("cancellation storm: clients=%d (6 storming, 2 steady) cancels=%d %s; tokens lost=%d",
		len(r.procs), count(evs, history.KCancel, nil), rep.Summary(), lost)
	assert.Greater(t, rep.Cancels, 50, "the storm cancelled too few Acquires")
	steady := 0
	for _, p := range r.procs[6:] {
		steady += count(evs, history.KAcq, func(e history.Event) bool { return e.Pid == p.pid() })
	}
	assert.Positive(t, steady, "steady clients starved")
}
