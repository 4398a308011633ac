package redsem

// The explorer's invariants, checked after every step of every run. Redis's
// deadlines are read by the server's clock (Redis TIME), which may stand
// still or step back behind the clients' (explore_clock_test.go):
//
//  1. No grant while the size or more hold: when a command makes Redis
//     record a new acquisition, the leases Redis counts as live (deadline
//     not passed, retired ones after a shrink included) number at most the
//     size. And never more believed holders than the largest size set. A
//     believed holder is a living client whose lease is Valid(), unless
//     Redis already ran its Release (the reply is on its way).
//  2. A client that believes it holds is recorded by Redis as the holder:
//     its acquisition owns every token's record, and no token's deadline
//     in Redis has passed.
//  3. Every valid token is in exactly one place (the token list, a pending
//     list, the leases, or withheld by a shrink); a retired one in at most
//     one.
//  4. Fences strictly increase from grant to grant, also while the server's
//     clock stands still or steps back (a fence from TIME alone would
//     repeat or fall); meta's fence never goes back.
//  5. TryAcquire never says "no token" while a valid token is free or a
//     lease on one has expired, and Release never reports success unless
//     Redis saw it take this acquisition's lease back.
//  6. At the end, once every program ran and time passed: every client
//     finished (no waiter waits forever while tokens are free), and the
//     library's own Check finds the semaphore whole and free.
//  7. A believed holder holds, in its lease and in Redis's records, the
//     permits its operation asked for: one token for Acquire and
//     TryAcquire, k for AcquireN(k) and TryAcquireN(k); on an RWMutex, one
//     read for RLock and TryRLock, the write for Lock and TryLock.
//  8. Refresh never revives a lease: no command leaves a lease whose
//     deadline had passed when it ran (swept or not) with a later one,
//     unless the token went to another acquisition. (A server clock that
//     steps back makes a lease live again by that clock: no revival.)
//  9. A believed holder's local deadline (Lease.Deadline) is no later than
//     the earliest moment, on the clients' clock, at which the server's
//     clock can reach its lease's deadline in Redis: that deadline less the
//     skew (server less clients) of now, since the skew only falls.
// 10. Nobody waits while a permit is free, at every quiet point (no command
//     waits to run at the server, no reply to be read, no goroutine at a
//     failpoint: only time can pass). No Acquire waits while a valid token
//     lies on the token list; no AcquireN(k) whose registration is live
//     waits while k do and no weighted request holds the collector ticket;
//     no collector that has all k sleeps (the release that completes it
//     rings it). What may wait: a one-token waiter while a collector takes
//     the released tokens, a weighted request behind the ticket holder, a
//     collector holding part of its k that has not seen tokens come back
//     by reclaim (it checks in every collectPoll), a weighted request whose
//     registration lapsed (it learns so at its next check-in), and anyone
//     while a shrink drains (a token taken may be withheld).
// 11. A shrink's bookkeeping says what the leases say: meta's over counts
//     the leases on retired tokens still out, held (at most over) the
//     tokens withheld, each in h:1..h:held; once the drain ends, none of
//     these fields is left.
// 12. A cancelled or timed-out acquisition leaves nothing behind by the next
//     quiet point when no other fault struck: no lease of an acquisition no
//     client got, no token in a pending list (not one TTL, or a sweep,
//     later).
// Data loss suspends 1 and 2 for the leases granted before it (Redis
// cannot promise them; the README says so), and, once the server's clock
// stood still or stepped back, 4 across a loss or an idle expiry (a
// semaphore created anew starts its fences over from TIME: the README says
// so too); a stranger's key overwrite suspends 2, 3 and 10 until the key is
// put back.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

type checker struct {
	pending   string          // a violation seen by an operation, reported at the next check
	fenced    map[string]bool // acquisitions whose fence was checked
	maxFence  float64         // highest fence granted
	metaFence float64         // meta's fence at the last check
	admin     *Semaphore      // for the final Reclaim and Check, on a direct pool
	rwAdmin   *RWMutex        // with scenario.rw: for the final TryLock
	maxSize   int             // the largest size Redis held
	rwTry     *rwTrySnapshot  // with scenario.rw: what a try's script saw
	epoch     string          // the semaphore's epoch at the last check
	skewed    bool            // the server's clock stood still or stepped back during the run
	acqs      map[string]int  // acquisition id -> client, of acquire_n.lua's calls
	acqOf     map[int]string  // client -> its latest acquire_n.lua call's acquisition id
}

func (c *checker) init(admin *Semaphore) {
	c.fenced = map[string]bool{}
	c.acqs, c.acqOf = map[string]int{}, map[int]string{}
	c.admin = admin
}

// grants checks invariant 1 at the command that granted: what it added
// to Redis's records, against the leases live right after it.
func (c *checker) grants(r *run, label string, before, after srvView) {
	if r.sc.rw || c.pending != "" || !after.exists || len(r.saved) > 0 {
		return
	}
	owners := map[string]bool{}
	for _, a := range before.holders {
		owners[a] = true
	}
	var fresh []string
	for tok, a := range after.holders {
		if !owners[a] {
			fresh = append(fresh, tok)
		}
	}
	if len(fresh) == 0 {
		return
	}
	nowMs := r.w.srvMs()
	live := 0
	for _, dl := range after.leases {
		if dl > nowMs {
			live++
		}
	}
	if live > after.size {
		sort.Strings(fresh)
		c.pending = fmt.Sprintf("%s granted %v while %d leases are live and the size is %d", label, fresh, live, after.size)
	}
}

// trySnapshot is what was free when a TryAcquire's script ran.
type trySnapshot struct {
	free, expired, over int
}

// srvView is the semaphore as Redis holds it.
type srvView struct {
	exists  bool
	size    int
	epoch   string
	fence   float64
	over    int
	held    []string
	list    []string
	leases  map[string]float64
	holders map[string]string  // token -> owner acquisition
	fences  map[string]float64 // acquisition -> fence of its records
	pends   map[string][]string
}

func (r *run) view() srvView {
	m, k := r.m, r.k
	v := srvView{leases: map[string]float64{}, holders: map[string]string{}, fences: map[string]float64{}, pends: map[string][]string{}}
	if m.Type(k.meta) == "hash" {
		size, _ := strconv.Atoi(m.HGet(k.meta, "size"))
		v.size = size
		v.epoch = m.HGet(k.meta, "gen")
		v.exists = size > 0 && v.epoch != ""
		v.fence, _ = strconv.ParseFloat(m.HGet(k.meta, "fence"), 64)
		v.over, _ = strconv.Atoi(m.HGet(k.meta, "over"))
		n, _ := strconv.Atoi(m.HGet(k.meta, "held"))
		for i := 1; i <= n; i++ {
			if tok := m.HGet(k.meta, "h:"+strconv.Itoa(i)); tok != "" {
				v.held = append(v.held, tok)
			}
		}
	}
	if m.Type(k.tokens) == "list" {
		v.list, _ = m.List(k.tokens)
	}
	if m.Type(k.leases) == "zset" {
		members, _ := m.ZMembers(k.leases)
		for _, mem := range members {
			v.leases[mem], _ = m.ZScore(k.leases, mem)
		}
	}
	if m.Type(k.holders) == "hash" {
		fields, _ := m.HKeys(k.holders)
		for _, f := range fields {
			if !strings.HasPrefix(f, "t:") {
				continue
			}
			rec := strings.Split(m.HGet(k.holders, f), "|")
			v.holders[f[2:]] = rec[0]
			if len(rec) > 1 {
				fence, _ := strconv.ParseFloat(rec[1], 64)
				if fence > v.fences[rec[0]] {
					v.fences[rec[0]] = fence
				}
			}
		}
	}
	for _, key := range m.Keys() {
		if strings.HasPrefix(key, k.base+"pend:") && m.Type(key) == "list" {
			v.pends[key], _ = m.List(key)
		}
	}
	return v
}

// epochSlot returns the slot of tok if it is a token of epoch.
func epochSlot(tok, epoch string) (int, bool) {
	e, s, ok := strings.Cut(tok, ":")
	if !ok || e != epoch {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 1
}

// beforeExec and afterExec watch one command of cl's current operation
// (w.mu held).
func (c *checker) beforeExec(cl *vclient, cmd string, sent simCmd) interface{} {
	r := c.runOf(cl)
	if cmd == "acquire_n.lua" {
		// EVALSHA sha numkeys KEYS... size acqID ...: whose collector is whose.
		if nk, err := strconv.Atoi(fmt.Sprint(sent.args[1])); err == nil && len(sent.args) > nk+3 {
			acq := fmt.Sprint(sent.args[nk+3])
			c.acqs[acq], c.acqOf[cl.id] = cl.id, acq
		}
	}
	if r.sc.rw {
		return c.rwBeforeExec(r, cl, cmd)
	}
	switch {
	case cl.cur.kind == opTryAcquire && cmd == "acquire.lua":
		// What was free when the script that may answer "none" ran.
		v := r.view()
		snap := &trySnapshot{over: v.over}
		nowMs := r.w.srvMs()
		for _, tok := range v.list {
			if n, ok := epochSlot(tok, v.epoch); ok && n <= v.size {
				if _, leased := v.leases[tok]; !leased {
					snap.free++
				}
			}
		}
		for tok, dl := range v.leases {
			if n, ok := epochSlot(tok, v.epoch); ok && n <= v.size && dl <= nowMs {
				snap.expired++
			}
		}
		return snap
	case cl.cur.kind == opRelease || cl.cur.kind == opResign:
		if cl.lease != nil {
			return r.view().holders[cl.lease.token]
		}
	}
	return nil
}

func (c *checker) afterExec(cl *vclient, before interface{}) {
	r := c.runOf(cl)
	// Time runs on while Redis works: 10µs a command.
	r.w.tick(10*time.Microsecond, false)
	switch b := before.(type) {
	case *rwTrySnapshot:
		c.rwTry = b
	case rwHeld:
		if cl.lease != nil && bool(b) && !r.rwView().has(cl.lease.acqID) {
			cl.selfReleased = true
		}
	case *trySnapshot:
		cl.trySnap = b
	case string:
		if cl.lease != nil && b == cl.lease.acqID && r.view().holders[cl.lease.token] != b {
			cl.selfReleased = true
		}
	}
}

func (c *checker) runOf(cl *vclient) *run { return cl.run }

// tryRefused is called when cl's TryAcquire returned ErrNoToken.
func (c *checker) tryRefused(cl *vclient) {
	r := cl.run
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if r.sc.rw {
		c.rwTryRefused(cl)
		return
	}
	s := cl.trySnap
	if s != nil && c.pending == "" && (s.free > 0 || (s.expired > 0 && s.over == 0)) {
		c.pending = fmt.Sprintf("c%d TryAcquire said no token free while %d valid tokens were free and %d leases had expired", cl.id, s.free, s.expired)
	}
}

// releasedOK is called when cl's Release returned nil.
func (c *checker) releasedOK(cl *vclient) {
	r := cl.run
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if !cl.selfReleased && c.pending == "" {
		c.pending = fmt.Sprintf("c%d Release returned nil, but Redis never saw its lease taken back", cl.id)
	}
}

// check tests invariants 1 to 5 and returns the first violation, or "".
func (c *checker) check(r *run) string {
	if c.pending != "" {
		return c.pending
	}
	r.w.mu.Lock()
	nowMs, skew := r.w.srvMs(), r.w.skew
	r.w.mu.Unlock()
	if r.sc.rw {
		if msg := c.checkRW(r); msg != "" {
			return msg
		}
		return rwHeldAsGranted(r, skew)
	}
	if r.rate != nil {
		return r.checkRate()
	}
	v := r.view()
	strangerHere := len(r.saved) > 0

	// 1 and 2.
	believed, fresh := 0, -1
	var who []string
	for _, cl := range r.clients {
		releasing := cl.busy > 0 && (cl.cur.kind == opRelease || cl.cur.kind == opResign) && cl.selfReleased
		if cl.dead || cl.lease == nil || cl.preLoss || releasing || !cl.lease.Valid() {
			if cl.newBelief {
				cl.newBelief = false
			}
			continue
		}
		believed += len(cl.lease.tokens)
		who = append(who, fmt.Sprintf("c%d:%s", cl.id, strings.Join(cl.lease.tokens, ",")))
		if cl.newBelief {
			cl.newBelief, fresh = false, cl.id
		}
		if strangerHere {
			continue
		}
		for _, tok := range cl.lease.tokens {
			owner, rec := v.holders[tok]
			dl, leased := v.leases[tok]
			switch {
			case !rec || owner != cl.lease.acqID:
				return fmt.Sprintf("c%d believes it holds %s, but Redis records %q as its holder", cl.id, tok, owner)
			case !leased:
				return fmt.Sprintf("c%d believes it holds %s, but Redis has no lease on it", cl.id, tok)
			case dl <= nowMs:
				return fmt.Sprintf("c%d believes it holds %s, but its lease expired in Redis %vms ago", cl.id, tok, nowMs-dl)
			}
		}
		if msg := heldAsGranted(cl, v); msg != "" {
			return msg
		}
		if msg := localBeforeServer(cl, v.leases[cl.lease.token], skew); msg != "" {
			return msg
		}
	}
	if v.size > c.maxSize {
		c.maxSize = v.size
	}
	if fresh >= 0 && believed > c.maxSize {
		return fmt.Sprintf("c%d believes it was granted while %d permits were believed held (%s), above any size set (%d)", fresh, believed, strings.Join(who, " "), c.maxSize)
	}

	// 3.
	if v.exists && !strangerHere {
		places := map[string][]string{}
		add := func(tok, where string) { places[tok] = append(places[tok], where) }
		for _, tok := range v.list {
			add(tok, "list")
		}
		for key, toks := range v.pends {
			for _, tok := range toks {
				add(tok, strings.TrimPrefix(key, r.k.base))
			}
		}
		for tok := range v.leases {
			add(tok, "leases")
		}
		for _, tok := range v.held {
			add(tok, "withheld")
		}
		for slot := 1; slot <= v.size; slot++ {
			tok := v.epoch + ":" + strconv.Itoa(slot)
			// A stranger's copies may sit on the list or in a pending list
			// (a BLMOVE carries them there) beside the real one; a token is
			// leased or withheld in one place at most.
			held := 0
			for _, p := range places[tok] {
				if p == "leases" || p == "withheld" {
					held++
				}
			}
			if n := len(places[tok]); n == 0 || held > 1 || n > 1+r.forged[tok] {
				return fmt.Sprintf("token %s is in %d places %v (want exactly one)", tok, n, places[tok])
			}
		}
		for tok, where := range places {
			if n, ok := epochSlot(tok, v.epoch); ok && n > v.size && len(where) > 1 {
				return fmt.Sprintf("retired token %s is in %d places %v", tok, len(where), where)
			}
		}
	}

	// 11.
	if v.exists && !strangerHere {
		if msg := shrinkBooks(r, v); msg != "" {
			return msg
		}
	}

	// 4.
	// An idle semaphore's meta expires with its fence; the one created next
	// must start above every fence granted (a fence a stranger wrote and no
	// grant took, such as 2^53, expires with it).
	// So must one created after the data was lost, unless the server's
	// clock stood still or stepped back during the run: then a semaphore
	// created anew starts its fences over from Redis TIME (the README says
	// so).
	if v.exists && v.epoch != c.epoch {
		if c.epoch != "" && c.skewed {
			c.maxFence, c.metaFence = 0, 0
		}
		c.epoch = v.epoch
	}
	if !v.exists && r.sc.idle > 0 {
		c.metaFence = c.maxFence
	} else {
		if v.fence < c.metaFence && !r.loss {
			return fmt.Sprintf("meta's fence went back from %.0f to %.0f", c.metaFence, v.fence)
		}
		c.metaFence = v.fence
	}
	acqs := make([]string, 0, len(v.fences))
	for a := range v.fences {
		acqs = append(acqs, a)
	}
	sort.Slice(acqs, func(i, j int) bool { return v.fences[acqs[i]] < v.fences[acqs[j]] })
	for _, a := range acqs {
		f := v.fences[a]
		if f <= 0 || c.fenced[a] {
			continue
		}
		if f <= c.maxFence {
			return fmt.Sprintf("acquisition %s was granted fence %.0f, not above an earlier grant's %.0f", a[:8], f, c.maxFence)
		}
		if f >= math.Pow(2, 53) {
			return fmt.Sprintf("acquisition %s was granted fence %.0f, beyond the integers a Lua number holds exactly", a[:8], f)
		}
		c.fenced[a] = true
		c.maxFence = f
	}
	return c.nobodyWaits(r, v, nowMs)
}

// shrinkBooks checks invariant 11: meta's shrink fields say what the
// leases say. over counts the leases on retired tokens, held the withheld
// tokens, h:1..h:held, no more, no fewer, and held <= over; once the drain
// ends (over 0), none of them is left.
func shrinkBooks(r *run, v srvView) string {
	retired := 0
	for tok := range v.leases {
		if n, ok := epochSlot(tok, v.epoch); ok && n > v.size {
			retired++
		}
	}
	fields, _ := r.m.HKeys(r.k.meta)
	held, _ := strconv.Atoi(r.m.HGet(r.k.meta, "held"))
	var books []string
	for _, f := range fields {
		i, err := strconv.Atoi(strings.TrimPrefix(f, "h:"))
		switch {
		case f == "over" || f == "held":
			books = append(books, f+"="+r.m.HGet(r.k.meta, f))
		case strings.HasPrefix(f, "h:") && (err != nil || i < 1 || i > held):
			return fmt.Sprintf("meta holds %s beside held=%d", f, held)
		}
	}
	switch {
	case v.over != retired:
		return fmt.Sprintf("meta's over is %d while %d leases on retired tokens are out", v.over, retired)
	case v.over == 0 && len(books) > 0:
		return fmt.Sprintf("the drain ended, and meta still holds %v", books)
	case held > v.over:
		return fmt.Sprintf("%d tokens withheld for %d retired leases", held, v.over)
	case len(v.held) != held:
		return fmt.Sprintf("held=%d, but meta holds %d withheld tokens", held, len(v.held))
	}
	return ""
}

// heldAsGranted checks invariant 7 for cl, a believed holder: its lease
// and Redis's records hold the permits its operation asked for.
func heldAsGranted(cl *vclient, v srvView) string {
	want := 1
	if k := cl.leaseOp.kind; k == opAcquireN || k == opTryAcquireN {
		want = cl.leaseOp.n
	}
	recorded := 0
	for _, owner := range v.holders {
		if owner == cl.lease.acqID {
			recorded++
		}
	}
	if len(cl.lease.tokens) != want || recorded != want {
		return fmt.Sprintf("c%d asked for %d permits (%v) and believes it holds %d, Redis records %d",
			cl.id, want, cl.leaseOp, len(cl.lease.tokens), recorded)
	}
	return ""
}

// rwHeldAsGranted checks invariants 7 and 9 on an RWMutex: a believed
// holder holds one read, or the write, as its operation asked.
func rwHeldAsGranted(r *run, skew time.Duration) string {
	v := r.rwView()
	for _, cl := range r.clients {
		releasing := cl.busy > 0 && cl.cur.kind == opRelease && cl.selfReleased
		if cl.dead || cl.lease == nil || cl.preLoss || releasing || !cl.lease.Valid() {
			continue
		}
		want := "r"
		if k := cl.leaseOp.kind; k == opLock || k == opTryLock {
			want = "w"
		}
		if mode := v.modes[cl.lease.acqID]; len(cl.lease.tokens) != 1 || mode != want {
			return fmt.Sprintf("c%d asked for %v and believes it holds %d leases, Redis records a %q one",
				cl.id, cl.leaseOp, len(cl.lease.tokens), mode)
		}
		if msg := localBeforeServer(cl, v.leases[cl.lease.acqID], skew); msg != "" {
			return msg
		}
	}
	return ""
}

// localBeforeServer checks invariant 9 for cl, a believed holder whose
// lease Redis records with deadline dlMs (server ms; 0: none): its local
// deadline is no later than the earliest moment, on the clients' clock,
// that the server's clock can reach dlMs. The skew (server less clients)
// only falls, so that is dlMs less the skew of now.
func localBeforeServer(cl *vclient, dlMs float64, skew time.Duration) string {
	if dlMs == 0 {
		return ""
	}
	srv := time.UnixMilli(int64(dlMs)).Add(-skew)
	if local := cl.lease.Deadline(); local.After(srv) {
		return fmt.Sprintf("c%d's local deadline falls %v after its lease's deadline in Redis (the server's clock %v behind)",
			cl.id, local.Sub(srv), -skew)
	}
	return ""
}

// revived checks invariant 8 at each command: a lease whose deadline had
// passed by the server's clock when the command ran (at, ms) has no later
// deadline after it, unless another acquisition holds the token now.
func (c *checker) revived(r *run, label string, at float64, before, after srvView) {
	if c.pending != "" || len(r.saved) > 0 {
		return
	}
	for m, dl := range before.leases {
		if now, ok := after.leases[m]; ok && dl <= at && now > dl && before.holders[m] == after.holders[m] {
			c.pending = fmt.Sprintf("%s extended the lease on %s from %.0f to %.0f, %.0fms after it expired by the server's clock",
				label, m, dl, now, at-dl)
			return
		}
	}
}

// cancelledLeftNothing checks invariant 12 at a quiet point: when every
// fault of the run was a context's end, no token is kept by an acquisition
// that never reached its client (a cancelled or timed-out one, settled by
// now), nor lies in a pending list. With any other fault the token may
// come back later, by the bounds the README gives. A lease past its
// deadline by the server's clock (nowMs) is free already: the next
// acquisition sweeps it (a Campaign whose claim came after its lease
// expired leaves one).
func cancelledLeftNothing(r *run, v srvView, nowMs float64) string {
	if r.faults > r.cancels || r.killed || r.strangerI > 0 || r.loss || r.chk.skewed {
		return ""
	}
	// A weighted collector's tokens, sealed or not, are its own until its
	// client reads the grant: invariant 10 holds it to waking.
	if r.m.HGet(r.k.meta, "coll") != "" || r.m.HGet(r.k.meta, "seal") != "" {
		return ""
	}
	for tok, owner := range v.holders {
		if dl, leased := v.leases[tok]; leased && dl > nowMs && v.fences[owner] > 0 && !r.granted[owner] {
			return fmt.Sprintf("token %s is leased at a quiet point to acquisition %s, which no client got: free only after its TTL", tok, owner[:8])
		}
	}
	for key, toks := range v.pends {
		if len(toks) > 0 {
			return fmt.Sprintf("%s holds %v at a quiet point: free only after a sweep", strings.TrimPrefix(key, r.k.base), toks)
		}
	}
	return ""
}

// nobodyWaits checks invariant 10 at a quiet point (nowMs: the server's
// clock in ms).
func (c *checker) nobodyWaits(r *run, v srvView, nowMs float64) string {
	r.w.mu.Lock()
	quiet := r.w.quiet()
	r.w.mu.Unlock()
	if !quiet || !v.exists || v.over > 0 || len(v.held) > 0 || len(r.saved) > 0 || r.corrupted {
		return ""
	}
	if msg := cancelledLeftNothing(r, v, nowMs); msg != "" {
		return msg
	}
	free := map[string]bool{}
	for _, tok := range v.list {
		if n, ok := epochSlot(tok, v.epoch); ok && n <= v.size {
			if _, leased := v.leases[tok]; !leased {
				free[tok] = true
			}
		}
	}
	coll := strings.Split(r.m.HGet(r.k.meta, "coll"), "|") // acqID|k|have|deadlineMs|label
	for _, cl := range r.clients {
		// A waiter whose connection broke may back off before it retries
		// (while Redis is unreachable: the driver's backoff, 500ms at most).
		if cl.dead || cl.busy == 0 || cl.canceled || r.broke[cl.id] || (cl.cur.kind != opAcquire && cl.cur.kind != opAcquireN && cl.cur.kind != opCampaign) {
			continue
		}
		k := max(cl.cur.n, 1)
		switch {
		case k == 1 && len(free) > 0:
			return fmt.Sprintf("c%d waits in %v while %d tokens are free on the list", cl.id, cl.cur, len(free))
		case k > 1 && len(coll) < 5 && len(free) >= k:
			// Unless its registration lapsed (a BLPOP that reached Redis
			// late): it learns so at its next check-in.
			if live, err := r.m.ZScore(r.k.waits, "w:"+c.acqOf[cl.id]); err == nil && live > nowMs {
				return fmt.Sprintf("c%d waits in %v while %d tokens are free on the list and no weighted request holds the ticket",
					cl.id, cl.cur, len(free))
			}
		case k > 1 && len(coll) == 5 && c.acqs[coll[0]] == cl.id && coll[1] == coll[2]:
			if dl, _ := strconv.ParseFloat(coll[3], 64); dl > nowMs {
				return fmt.Sprintf("c%d collects all %s permits of its %v, yet sleeps", cl.id, coll[1], cl.cur)
			}
		}
	}
	return ""
}

// final tests invariant 6 after the drain.
func (c *checker) final(r *run) string {
	for _, cl := range r.clients {
		if !cl.dead && (cl.busy > 0 || cl.pc < len(cl.prog)) {
			return fmt.Sprintf("c%d never finished %v (results %v): it waits while the world is quiet", cl.id, cl.cur, cl.results)
		}
	}
	if r.sc.rw {
		return c.finalRW(r)
	}
	if r.rate != nil {
		return r.finalRate()
	}
	if r.el != nil {
		return r.finalElection()
	}
	// Every lease a program left behind expires; a Reclaim gives it back.
	w := r.w
	w.mu.Lock()
	w.stall = 0
	w.advanceTo(w.now.Add(r.sc.ttl + r.sc.grace + engine.MaxBlock + engine.BlockSlack + time.Minute))
	w.mu.Unlock()
	ctx := context.Background()
	if r.repairAtEnd {
		// What a stranger pushed is dropped as it is popped, or by Repair.
		if _, err := c.admin.Repair(ctx); err != nil && !errors.Is(err, ErrRepairUnsafe) {
			return "final Repair failed: " + err.Error()
		}
	}
	if _, err := c.admin.Reclaim(ctx); err != nil {
		if errors.Is(err, ErrCorrupt) && r.corrupted {
			return "" // a stranger corrupted meta: refusing it is right
		}
		return "final Reclaim failed: " + err.Error()
	}
	inv, err := c.admin.Check(ctx)
	if err != nil {
		return "final Check failed: " + err.Error()
	}
	if !inv.Healthy() || (inv.Exists && len(inv.Free) != inv.Size) {
		return fmt.Sprintf("at the end the semaphore is not whole and free: size %d, free %v, leased %v, pending %v, withheld %v, missing %v, duplicates %v, strangers %v",
			inv.Size, inv.Free, inv.Leased, inv.Pending, inv.Withheld, inv.Missing, inv.Duplicates, inv.Strangers)
	}
	// A dead weighted collector's ticket (meta coll) and a dead weighted
	// request's place in the queue stay until the next weighted request
	// clears them, and keep the name from expiring meanwhile.
	if r.sc.idle > 0 && len(r.sc.strangers) == 0 && !r.loss && r.m.HGet(r.k.meta, "coll") == "" && !r.m.Exists(r.k.base+"wqueue") {
		// Idle now: once the idle time and the last tombstone have passed,
		// nothing of it is left.
		w.mu.Lock()
		w.advanceTo(w.now.Add(r.sc.idle + r.sc.grace + engine.MaxBlock + engine.BlockSlack + time.Minute))
		w.mu.Unlock()
		// One leftover is known: the pending list of a BLMOVE that
		// reached Redis after its registration was swept, from a process
		// killed before its script ran. Its tombstone would sweep it, but
		// the keys expire with the tombstone; the token in it is of an
		// epoch that no longer exists.
		var left []string
		for _, key := range r.m.Keys() {
			if !strings.HasPrefix(key, r.k.base+"pend:") {
				left = append(left, key)
			}
		}
		if len(left) > 0 {
			return fmt.Sprintf("idle at the end, yet keys are left after the idle time: %v", left)
		}
	}
	return ""
}
