package faults

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// A thousand names with the shortest idle expiry, while holders and
// waiters come and go (a few hot names contended, the rest used now and
// then, so that they expire between uses), workers killed -9 and Acquires
// cancelled: for every name, the history shows at most size holders at any
// instant across its epochs (an expiry under a holder would show as a
// holder of an old epoch beside size of the new one), and at the end every
// name left in Redis is on its way out (its keys carry the expiry).
func TestIdleExpiryChurn(t *testing.T) {
	t.Parallel()
	const size, nNames = 2, 1000
	srv := redistest.Start(t)
	r := newRun(t, srv, size, 800*time.Millisecond, 300*time.Millisecond)
	// The churn runs for runFor, and on (two minutes at most) until it has
	// used as many names as the checks below ask: a loaded machine makes
	// fewer holds in a given time.
	runFor, ceiling := scaled(6*time.Second, 10), 2*time.Minute
	start := time.Now()
	enough := func() bool {
		evs, _, err := history.Read(r.hist)
		used := map[string]bool{}
		for _, e := range evs {
			if e.K == history.KAcq && e.Name != "" {
				used[e.Name] = true
			}
		}
		return err == nil && len(used) > nNames/2
	}
	spawn := func(i int) *proc {
		args := []string{"-dur", (runFor + ceiling).String(), "-stopfile", r.stopFile(), "-names", fmt.Sprint(nNames),
			"-idle", minIdleExpiry.String(), "-goroutines", "4", "-holdmin", "2ms", "-holdmax", "30ms", "-gapmax", "5ms"}
		if i%2 == 0 {
			args = append(args, "-storm", "-steady", "2")
		}
		return r.spawn(args...)
	}
	live := map[*proc]bool{}
	for i := 0; i < 4; i++ {
		live[spawn(i)] = true
	}
	kills := 0
	for time.Since(start) < runFor-time.Second || (time.Since(start) < ceiling && !enough()) {
		time.Sleep(time.Duration(300+rand.IntN(500)) * time.Millisecond)
		for p := range live {
			p.kill9()
			kills++
			delete(live, p)
			live[spawn(kills)] = true
			break
		}
	}
	r.stop()
	r.waitAll(40 * time.Second)

	byName := map[string][]history.Event{}
	var shared []history.Event
	for _, e := range r.events() {
		if e.Name == "" {
			shared = append(shared, e)
			continue
		}
		byName[e.Name] = append(byName[e.Name], e)
	}
	holds, epochs, contended := 0, 0, 0
	for name, evs := range byName {
		rep := history.Check(append(evs, shared...), history.Options{N: size})
		for _, v := range rep.Violations {
			t.Errorf("history of %s: %s", name, v)
		}
		holds += rep.Holds
		seen := map[string]bool{}
		for _, e := range evs {
			if ep, _, ok := strings.Cut(e.Tok, ":"); e.K == history.KAcq && ok && !seen[ep] {
				seen[ep] = true
				epochs++
			}
		}
		if rep.MaxOverlap == size {
			contended++
		}
	}
	t.Logf("idle churn: %d names used, %d holds, %d epochs (each expiry and reuse is one more), %d names held by %d at once, %d kills",
		len(byName), holds, epochs, contended, size, kills)
	assert.Greater(t, len(byName), nNames/2, "names used")
	assert.Greater(t, epochs, len(byName), "no name expired and was used again")
	assert.Positive(t, contended, "no name was contended")

	// Leases of killed holders lapse within the TTL, and a killed waiter's
	// pending token comes back once its wait's deadline has passed; a
	// Reclaim then leaves each such name idle. Every name left must be on
	// its way out: polled name by name (a loaded machine delays the
	// lapses), with a ceiling far past any TTL or wait.
	ctx := ctxT(t, 5*time.Minute)
	c := adminConn(t, srv)
	metas, err := redis.Strings(c.Do("KEYS", redsem.DefaultPrefix+"*:meta"))
	require.NoError(t, err)
	forever := 0
	for _, key := range metas {
		name := key[len(redsem.DefaultPrefix)+1 : len(key)-len("}:meta")]
		s := opsFor(t, r.pool(), name)
		onItsWay := waitFor(time.Minute, func() bool {
			_, err := s.Reclaim(ctx)
			require.NoError(t, err)
			ttl, err := redis.Int64(c.Do("PTTL", key))
			require.NoError(t, err)
			return ttl != -1 // -2: gone already
		})
		if !onItsWay {
			st, _ := s.Status(ctx)
			t.Logf("%s keeps its keys: %+v", name, st)
			forever++
		}
	}
	t.Logf("%d names left in Redis after the run, %d without an expiry", len(metas), forever)
	assert.Zero(t, forever, "names that would stay forever")
}

// minIdleExpiry is the shortest idle time redsem.WithIdleExpiry takes.
const minIdleExpiry = 100 * time.Millisecond
