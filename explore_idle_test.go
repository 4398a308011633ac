package redsem

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/require"
)

// exploreIdle is the idle time of the explorer's runs with idle expiry:
// the shortest there is, so that the keys' expiry falls among the leases'
// deadlines and block timeouts.
const exploreIdle = MinIdleExpiry

// idleScenarios are the seam scenarios of the semaphore with idle expiry
// on, and one made for it: a name used, left idle, and used again, held
// while the time its keys would have expired passes.
func idleScenarios() []scenario {
	out := []scenario{holdersThen(scenario{
		name: "idle, then used again past the idle time", size: 1,
		progs: [][]op{{acq, rel}, {acq, rel}, {try, rel}},
	})}
	for _, sc := range seamScenarios() {
		if !sc.rw {
			out = append(out, sc)
		}
	}
	for i := range out {
		out[i].idle = exploreIdle
	}
	return out
}

// TestExplore_idleExpiry runs the seam scenarios and random programs with
// WithIdleExpiry: the keys' expiry is one of the steps (time passes to it),
// and every invariant must hold, fences across a recreation included.
func TestExplore_idleExpiry(t *testing.T) {
	if !alone(t) {
		return
	}
	env := newExploreEnv(t)
	budget := exploreBudget(time.Second, 30*time.Second)
	scs := idleScenarios()
	for _, sc := range scs {
		start := time.Now()
		slice := budget / time.Duration(2*len(scs)+2)
		cx, n, all := exploreAll(t, env, sc, exploreDepth, start.Add(slice))
		t.Logf("%s: %d schedules to depth %d (all of them: %v)", sc.name, n, exploreDepth, all)
		if cx != "" {
			t.Fatal(cx)
		}
		cx, n = walkScenario(t, env, sc, 1, 40, time.Now().Add(slice))
		t.Logf("%s: %d random schedules", sc.name, n)
		if cx != "" {
			t.Fatal(cx)
		}
	}
	start := time.Now()
	n := 0
	for seed := firstSeed(t); time.Since(start) < budget/4; seed++ {
		rng := rand.New(rand.NewSource(seed))
		sc := randomScenario(rng)
		sc.name = fmt.Sprintf("random seed %d, idle expiry", seed)
		sc.idle = exploreIdle
		rc := &choiceRecorder{ch: &randomChooser{rng: rng, pFault: 0.1}}
		v, trace, err := exploreOnce(env, sc, rc, 60)
		require.NoError(t, err)
		n++
		if v != "" {
			t.Fatal(counterexample(sc, v, trace, rc.labels))
		}
	}
	t.Logf("%d random walks with idle expiry", n)
}

// TestExplorer_catchesMissingPersist shows the explorer catches a build in
// which an acquisition forgets to remove the idle expiry: meta and the token
// list expire under a holder (its lease and record, new keys, stay), and its
// release then leaves a token list without a semaphore, which the next
// creation refuses as corrupt.
func TestExplorer_catchesMissingPersist(t *testing.T) {
	if !alone(t) {
		return
	}
	src := engine.Source("acquire.lua")
	for _, cut := range []string{"  if exp then", "idle_setting(idle)\nwake()\n"} {
		require.Contains(t, src, cut)
	}
	src = strings.Replace(src, "  if exp then", "  if false then", 1)
	src = strings.Replace(src, "idle_setting(idle)\nwake()\n", "idle_setting(idle)\n", 1)
	saved := engine.Acquire
	engine.Acquire.Script = engine.Lua(6, src)
	defer func() { engine.Acquire = saved }()
	env := newExploreEnv(t)
	cx, n := exploreScenario(t, env, idleScenarios()[0], exploreDepth, time.Now().Add(time.Minute))
	t.Logf("found after %d schedules:\n%s", n, cx)
	require.Contains(t, cx, "VIOLATION")
}
