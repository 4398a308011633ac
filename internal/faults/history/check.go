package history

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Options tune Check.
type Options struct {
	// N is the semaphore's size.
	N int
	// PerEpoch checks overlap separately for each epoch (the part of a token
	// before the colon). A Redis that restarts without persistence comes
	// back with a new epoch while holders of the old one still believe
	// their leases until those expire; that overlap is reported in
	// Report.CrossEpochOverlap instead of as a violation.
	PerEpoch bool
	// AllowUnleased accepts valid holds whose lease Redis did not record
	// (again: a restart without persistence between the grant and the
	// worker's look at Redis).
	AllowUnleased bool
	// RW checks a read-write lock (RWMutex) instead of a semaphore: a hold
	// whose token ends in ":w" is a write hold and overlaps no other hold,
	// read or write (rule "rw"); read holds may overlap each other, share
	// their token ("<epoch>:r") and are not counted against N.
	RW bool
}

// Hold is one acquisition as the history shows it. Times are µs of Redis
// TIME. End is the earlier of the moment the holder stopped using the token
// and the lease deadline recorded in Redis; math.MaxInt64 when neither is
// known (a holder killed while holding a token without a lease).
type Hold struct {
	W, Pid, G, S int
	Tok          string
	// Toks are the hold's tokens: one, or k for AcquireN(k). A hold counts
	// len(Toks) permits.
	Toks      []string
	Fence     int64
	T0, Start int64
	End       int64
	DL        int64 // ms
	Released  bool  // a relstart event was seen
	RelValid  bool
	RelT      int64
	RelClass  string
}

// Report is what Check found.
type Report struct {
	// Workers counts processes, Holders the (process, goroutine) pairs.
	Events, Workers, Holders, Holds int
	// Permits is the sum over holds of their tokens; Weighted counts the
	// holds of more than one token.
	Permits, Weighted int
	// MaxOverlap is the largest number of permits held at one instant (per
	// epoch when Options.PerEpoch): the tokens of the holds open then.
	MaxOverlap int
	// MaxHolds is the largest number of holds open at one instant.
	MaxHolds          int
	CrossEpochOverlap int
	// With Options.RW: Writes counts the write holds, MaxReaders is the
	// largest number of read holds open at one instant.
	Writes, MaxReaders int
	Epochs             int
	Cancels            int
	Starved            int
	AcqErrs            map[string]int
	RelClasses         map[string]int
	FPKills            int
	Fatal              int
	Exits              int
	Violations         []string
	// Kinds counts violations by rule.
	Kinds map[string]int
}

// OK reports whether no rule was broken.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Summary is a one-line description for test logs.
func (r Report) Summary() string {
	return fmt.Sprintf("events=%d workers=%d holders=%d holds=%d permits=%d weighted=%d writes=%d maxReaders=%d maxOverlap=%d maxHolds=%d crossEpochOverlap=%d epochs=%d cancels=%d starved=%d acqErrs=%v releases=%v fpKills=%d exits=%d violations=%d %v",
		r.Events, r.Workers, r.Holders, r.Holds, r.Permits, r.Weighted, r.Writes, r.MaxReaders, r.MaxOverlap, r.MaxHolds, r.CrossEpochOverlap, r.Epochs, r.Cancels, r.Starved, r.AcqErrs, r.RelClasses, r.FPKills, r.Exits, len(r.Violations), r.Kinds)
}

func (r *Report) violate(kind, format string, args ...interface{}) {
	if r.Kinds == nil {
		r.Kinds = map[string]int{}
	}
	r.Kinds[kind]++
	if len(r.Violations) < 200 {
		r.Violations = append(r.Violations, kind+": "+fmt.Sprintf(format, args...))
	}
}

// Check verifies a history against the semaphore's guarantees:
//
//   - overlap: at no instant more than N permits held (a hold of k tokens
//     counts k; a hold lasts from the moment the holder saw its lease to the
//     earlier of the moment it stopped using it and its lease deadline in
//     Redis);
//   - token: no token is held by two holds at once, nor twice by one hold;
//   - fence: fences are positive, unique per acquisition (the k tokens of
//     one share it), and strictly increase in acquisition order (a hold
//     seen before another Acquire even started has the smaller fence);
//   - unleased: a lease the library called valid is recorded in Redis
//     with an unexpired deadline;
//   - stale: a holder whose Lease.Valid() was true had not passed its
//     Redis deadline;
//   - starved: every Acquire that was meant to succeed did;
//   - rw (Options.RW, instead of overlap and token): no write hold overlaps
//     another hold, read or write.
//
// A holder is a process and goroutine (Pid, G); its acquisitions are
// numbered by S.
//
// What the checker cannot see (tokens lost, strays left over) the tests check
// on the server after the run.
func Check(evs []Event, opt Options) Report {
	r := Report{Events: len(evs), AcqErrs: map[string]int{}, RelClasses: map[string]int{}, Kinds: map[string]int{}}
	type key struct{ pid, g, s int }
	type holder struct{ pid, g int }
	holds := map[key]*Hold{}
	workers := map[int]bool{}
	holders := map[holder]bool{}
	var order []key
	for _, e := range evs {
		workers[e.Pid] = true
		holders[holder{e.Pid, e.G}] = true
		switch e.K {
		case KAcq:
			if !e.Valid {
				continue // never used: the worker gave it back at once
			}
			k := key{e.Pid, e.G, e.S}
			if _, dup := holds[k]; dup {
				r.violate("history", "pid %d goroutine %d acquisition %d recorded twice", e.Pid, e.G, e.S)
				continue
			}
			toks := e.Toks
			if len(toks) == 0 {
				toks = []string{e.Tok}
			} else if toks[0] != e.Tok {
				r.violate("history", "pid %d goroutine %d acquisition %d: token %s is not the first of %v", e.Pid, e.G, e.S, e.Tok, toks)
			}
			if e.N > 0 && len(toks) != e.N {
				r.violate("permits", "worker %d pid %d goroutine %d: asked for %d permits, holds %d tokens %v", e.W, e.Pid, e.G, e.N, len(toks), toks)
			}
			holds[k] = &Hold{W: e.W, Pid: e.Pid, G: e.G, S: e.S, Tok: e.Tok, Toks: toks, Fence: e.Fence, T0: e.T0, Start: e.T, DL: e.DL}
			order = append(order, k)
			if e.DL <= 0 && !opt.AllowUnleased {
				r.violate("unleased", "worker %d pid %d: lease on %s fence %d was valid but Redis records no lease", e.W, e.Pid, e.Tok, e.Fence)
			} else if e.DL > 0 && e.T >= e.DL*1000 {
				r.violate("stale", "worker %d pid %d: lease on %s was valid at %d, after its deadline %d", e.W, e.Pid, e.Tok, e.T, e.DL*1000)
			}
		case KRelStart:
			if h := holds[key{e.Pid, e.G, e.S}]; h != nil {
				h.Released, h.RelValid, h.RelT = true, e.Valid, e.T
			}
		case KRel:
			if h := holds[key{e.Pid, e.G, e.S}]; h != nil {
				h.RelClass = e.Class
			}
			r.RelClasses[e.Class]++
		case KCancel:
			r.Cancels++
		case KStarved:
			r.Starved++
			r.violate("starved", "worker %d pid %d goroutine %d: Acquire(%d) gave up after %s", e.W, e.Pid, e.G, max(e.N, 1), e.Err)
		case KAcqErr:
			r.AcqErrs[e.Class]++
		case KFPKill:
			r.FPKills++
		case KFatal:
			r.Fatal++
		case KExit:
			r.Exits++
		}
	}
	r.Workers = len(workers)
	r.Holders = len(holders)

	var hs []*Hold
	for _, k := range order {
		h := holds[k]
		end := int64(math.MaxInt64)
		if h.Released {
			end = h.RelT
			if h.RelValid && h.DL > 0 && h.RelT >= h.DL*1000 {
				r.violate("stale", "worker %d pid %d: lease on %s was valid at %d, after its deadline %d", h.W, h.Pid, h.Tok, h.RelT, h.DL*1000)
			}
		}
		if h.DL > 0 && h.DL*1000 < end {
			end = h.DL * 1000
		}
		if end < h.Start {
			end = h.Start
		}
		h.End = end
		hs = append(hs, h)
		r.Permits += len(h.Toks)
		if len(h.Toks) > 1 {
			r.Weighted++
		}
	}
	r.Holds = len(hs)

	if opt.RW {
		checkRW(&r, hs)
	} else {
		checkTokens(&r, hs, opt)
	}
	checkFences(&r, hs)
	return r
}

// checkTokens is the semaphore's rules: at most N permits at once, and no
// token in two holds at once.
func checkTokens(r *Report, hs []*Hold, opt Options) {
	// overlap, per epoch or overall
	groups := map[string][]*Hold{}
	for _, h := range hs {
		g := ""
		if opt.PerEpoch {
			g = epochOf(h.Tok)
		}
		groups[g] = append(groups[g], h)
	}
	r.Epochs = len(groups)
	for g, gh := range groups {
		m, at := maxOverlap(gh, permits)
		if m > r.MaxOverlap {
			r.MaxOverlap = m
		}
		if m > opt.N {
			r.violate("overlap", "epoch %q: %d permits held at once (N=%d) at %d", g, m, opt.N, at)
		}
		if c, _ := maxOverlap(gh, one); c > r.MaxHolds {
			r.MaxHolds = c
		}
	}
	if opt.PerEpoch {
		r.CrossEpochOverlap, _ = maxOverlap(hs, permits)
	}

	// token: no token in two holds at once, nor twice in one
	byTok := map[string][]*Hold{}
	for _, h := range hs {
		in := map[string]bool{}
		for _, tok := range h.Toks {
			if in[tok] {
				r.violate("token", "worker %d pid %d goroutine %d: token %s twice in one hold %v (fence %d)", h.W, h.Pid, h.G, tok, h.Toks, h.Fence)
				continue
			}
			in[tok] = true
			byTok[tok] = append(byTok[tok], h)
		}
	}
	for tok, th := range byTok {
		sort.Slice(th, func(i, j int) bool { return th[i].Start < th[j].Start })
		for i := 1; i < len(th); i++ {
			if th[i].Start < th[i-1].End {
				r.violate("token", "token %s held by worker %d/%d (fence %d, %d..%d) and worker %d/%d (fence %d, from %d)",
					tok, th[i-1].W, th[i-1].G, th[i-1].Fence, th[i-1].Start, th[i-1].End, th[i].W, th[i].G, th[i].Fence, th[i].Start)
			}
		}
	}

}

// checkRW is the read-write lock's rule: a write hold overlaps no other hold.
// An end and a start at the same instant do not overlap.
func checkRW(r *Report, hs []*Hold) {
	var reads []*Hold
	byStart := append([]*Hold(nil), hs...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start < byStart[j].Start })
	for _, h := range byStart {
		if !isWrite(h) {
			reads = append(reads, h)
			continue
		}
		r.Writes++
	}
	r.MaxReaders, _ = maxOverlap(reads, one)
	r.MaxHolds, _ = maxOverlap(hs, one)
	for i, w := range byStart {
		if !isWrite(w) {
			continue
		}
		// Every hold that starts before w ends and ends after w starts.
		for j, o := range byStart {
			if o.Start >= w.End {
				break
			}
			if j == i || o.End <= w.Start || (isWrite(o) && j < i) {
				continue // two writers are reported once, from the earlier
			}
			kind := "read"
			if isWrite(o) {
				kind = "write"
			}
			r.violate("rw", "write hold of worker %d/%d (fence %d, %d..%d) overlaps the %s hold of worker %d/%d (fence %d, %d..%d)",
				w.W, w.G, w.Fence, w.Start, w.End, kind, o.W, o.G, o.Fence, o.Start, o.End)
		}
	}
}

// isWrite reports whether h is a write hold of a read-write lock.
func isWrite(h *Hold) bool { return strings.HasSuffix(h.Tok, ":w") }

// checkFences: fences are positive, unique, and increase in acquisition
// order.
func checkFences(r *Report, hs []*Hold) {
	// fence: positive, unique, ordered
	seen := map[int64]*Hold{}
	for _, h := range hs {
		if h.Fence <= 0 {
			r.violate("fence", "worker %d pid %d: hold of %s has no fence", h.W, h.Pid, h.Tok)
			continue
		}
		if o := seen[h.Fence]; o != nil {
			r.violate("fence", "fence %d given twice (workers %d and %d)", h.Fence, o.W, h.W)
		}
		seen[h.Fence] = h
	}
	byStart := append([]*Hold(nil), hs...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start < byStart[j].Start })
	prefMax := make([]int64, len(byStart))
	prefW := make([]*Hold, len(byStart))
	for i, h := range byStart {
		prefMax[i], prefW[i] = h.Fence, h
		if i > 0 && prefMax[i-1] > h.Fence {
			prefMax[i], prefW[i] = prefMax[i-1], prefW[i-1]
		}
	}
	for _, b := range hs {
		if b.T0 <= 0 {
			continue
		}
		// holds seen before b's Acquire started
		i := sort.Search(len(byStart), func(i int) bool { return byStart[i].Start >= b.T0 })
		if i > 0 && prefMax[i-1] >= b.Fence && b.Fence > 0 {
			a := prefW[i-1]
			r.violate("fence", "worker %d fence %d (Acquire from %d) is not above fence %d of worker %d seen at %d",
				b.W, b.Fence, b.T0, a.Fence, a.W, a.Start)
		}
	}
}

// permits weighs a hold by its tokens, one by one.
func permits(h *Hold) int { return len(h.Toks) }
func one(*Hold) int       { return 1 }

// maxOverlap sweeps the holds and returns the largest total weight open at
// once and when. An end and a start at the same instant do not overlap.
func maxOverlap(hs []*Hold, weight func(*Hold) int) (int, int64) {
	type pt struct {
		t int64
		d int
	}
	pts := make([]pt, 0, 2*len(hs))
	for _, h := range hs {
		w := weight(h)
		pts = append(pts, pt{h.Start, +w}, pt{h.End, -w})
	}
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].t != pts[j].t {
			return pts[i].t < pts[j].t
		}
		return pts[i].d < pts[j].d
	})
	cur, best, at := 0, 0, int64(0)
	for _, p := range pts {
		cur += p.d
		if cur > best {
			best, at = cur, p.t
		}
	}
	return best, at
}

func epochOf(tok string) string {
	e, _, _ := strings.Cut(tok, ":")
	return e
}
