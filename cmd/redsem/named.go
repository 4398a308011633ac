//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

// The kinds as the command names them, in "kind" of every JSON document and
// in its messages. A mutex is a semaphore of size 1 (one key layout).
const (
	kindSemaphore = "semaphore"
	kindMutex     = "mutex"
	kindRWMutex   = "rwmutex"
	kindRate      = "rate"
	kindNone      = "none" // status of a name that does not exist
)

// semKind is the kind of a semaphore of the stored size.
func semKind(size int) string {
	if size == 1 {
		return kindMutex
	}
	return kindSemaphore
}

// kindWords names a layout in a sentence.
func kindWords(k admin.Kind) string {
	switch k {
	case admin.KindRWMutex:
		return "read-write lock"
	case admin.KindRate:
		return "rate gate"
	case admin.KindElection:
		return "election"
	}
	return "semaphore"
}

// kindNames lists kinds by their JSON names, never nil.
func kindNames(kinds []admin.Kind) []string {
	out := []string{}
	for _, k := range kinds {
		out = append(out, string(k))
	}
	return out
}

// kindFlag is --kind: which of the kinds under NAME a command acts on when
// there are several (a semaphore and a lock of one name are apart).
type kindFlag struct{ k admin.Kind }

func (f *kindFlag) String() string { return string(f.k) }

func (f *kindFlag) Set(s string) error {
	switch s {
	case "semaphore", "sem", "mutex":
		f.k = admin.KindSemaphore
	case "rwmutex", "rw", "lock":
		f.k = admin.KindRWMutex
	case "rate", "gate":
		f.k = admin.KindRate
	case "election", "el":
		f.k = admin.KindElection
	default:
		return errors.New("not a kind: semaphore (or mutex), rwmutex, rate or election")
	}
	return nil
}

func registerKind(fs *flag.FlagSet) *kindFlag {
	f := &kindFlag{}
	fs.Var(f, "kind", "")
	return f
}

// named is NAME with the kinds that exist under it, looked up once.
type named struct {
	adm    *admin.Handle
	pool   admin.Pool
	prefix string
	name   string
	kinds  []admin.Kind
}

func (n *named) has(k admin.Kind) bool {
	for _, x := range n.kinds {
		if x == k {
			return true
		}
	}
	return false
}

// noSuchName is the error of every command but status for a NAME that does
// not exist: exit 66; or, when its keys are what an acquisition refuses,
// why (readLeftovers).
func (n *named) noSuchName(ctx context.Context, cmd string) error {
	if err := readLeftovers(ctx, n); err != nil {
		return err
	}
	return exitf(exitNoName, "%s: no semaphore, mutex, read-write lock, rate gate or election %q under prefix %q",
		cmd, n.name, n.prefix)
}

// pick returns the kind a command acts on: want (--kind) if given, else the
// first of the kinds that exist (semaphore, lock, rate gate). ok is false
// when that kind does not exist.
func (n *named) pick(want admin.Kind) (admin.Kind, bool) {
	if want != "" {
		return want, n.has(want)
	}
	if len(n.kinds) == 0 {
		return "", false
	}
	return n.kinds[0], true
}

// others lists the kinds under NAME besides k, for a line saying they exist.
func (n *named) others(k admin.Kind) []admin.Kind {
	var out []admin.Kind
	for _, x := range n.kinds {
		if x != k {
			out = append(out, x)
		}
	}
	return out
}

// alsoLine says which other kinds exist under NAME, and how to see them.
func alsoLine(name string, others []admin.Kind) string {
	var parts []string
	for _, k := range others {
		parts = append(parts, fmt.Sprintf("a %s (--kind %s)", kindWords(k), k))
	}
	return fmt.Sprintf("%q also names %s", name, strings.Join(parts, " and "))
}

// notFor refuses an action on a kind it does not apply to: exit 65.
func notFor(cmd, name string, k admin.Kind, why string) error {
	return exitf(exitData, "%s: %q is a %s: %s", cmd, name, kindWords(k), why)
}

// checked is the outcome of checking one name of one kind.
type checked struct {
	doc     any    // its check --json document
	line    string // its plain line
	healthy bool
}

// checkKind checks name as kind k: a semaphore's inventory (every slot in
// one place), a lock's readability, a rate gate's grant logs (no stray
// entry).
func checkKind(ctx context.Context, n *named, k admin.Kind) (checked, error) {
	switch k {
	case admin.KindRWMutex:
		st, err := n.adm.RWStatus(ctx)
		if err != nil {
			return checked{}, err
		}
		doc := toRWCheckJSON(st)
		writer := "none"
		if st.Writer != nil {
			writer = "1"
		}
		return checked{doc: doc, healthy: true, line: fmt.Sprintf("%q: rwmutex, readers %d, writer %s, waiting %d, expired %d: healthy",
			n.name, len(st.Readers), writer, len(st.Queue), doc.Expired)}, nil
	case admin.KindElection:
		st, err := n.adm.ElectionStatus(ctx)
		if err != nil {
			return checked{}, err
		}
		leader := "nobody leads"
		if st.Leader != nil {
			leader = fmt.Sprintf("%s leads, term %d", st.Value, st.Leader.Fence)
		}
		return checked{doc: toElectionJSON(st), healthy: true, line: fmt.Sprintf("%q: election, %s, waiting %d, observers %d: healthy",
			n.name, leader, st.Waiting, st.Observers)}, nil
	case admin.KindRate:
		st, err := rate.ReadStatus(ctx, n.pool, n.prefix, n.name)
		if err != nil {
			return checked{}, err
		}
		healthy := st.Stray == 0
		return checked{doc: toRateCheckJSON(st), healthy: healthy, line: fmt.Sprintf("%q: rate, %s, started %d, due %d, available %d, waiting %d, stray %d: %s",
			n.name, limitsText(st), st.Started, st.Due, st.Available, st.Waiting, st.Stray, healthWord(healthy))}, nil
	}
	inv, err := n.adm.Check(ctx)
	if err != nil {
		return checked{}, err
	}
	return checked{doc: toCheckJSON(inv), healthy: inv.Healthy(), line: inventoryLine(inv)}, nil
}

func healthWord(ok bool) string {
	if ok {
		return "healthy"
	}
	return "unhealthy"
}

// inventoryLine is check's plain line for a semaphore.
func inventoryLine(inv admin.Inventory) string {
	return fmt.Sprintf("%q: %s, size %d, free %d, pending %d, leased %d, withheld %d, retired %d, duplicates %d, strangers %d, missing %s: %s",
		inv.Name, semKind(inv.Size), inv.Size, len(inv.Free), len(inv.Pending), len(inv.Leased), len(inv.Withheld), len(inv.Retired),
		len(inv.Duplicates), len(inv.Strangers), slotList(inv.Missing), healthWord(inv.Healthy()))
}

// slotList writes slots for people: "none", "slot 3", "slots 2, 3".
func slotList(slots []int) string {
	switch len(slots) {
	case 0:
		return "none"
	case 1:
		return "slot " + strconv.Itoa(slots[0])
	}
	parts := make([]string, len(slots))
	for i, s := range slots {
		parts[i] = strconv.Itoa(s)
	}
	return "slots " + strings.Join(parts, ", ")
}

// wrongTypeHint adds to an error about a key of the wrong type, or a
// corrupt record (which repair does not mend), how to clear the name; not
// to a name of the layout before protocol v2, whose clients may hold it
// (the error says what to do).
func wrongTypeHint(err error, name string) error {
	if errors.Is(err, engine.ErrLayout) {
		return err
	}
	if errors.Is(err, redsem.ErrWrongType) || errors.Is(err, redsem.ErrCorrupt) {
		return fmt.Errorf("%w (redsem delete --force %s removes every key of the name)", err, shellQuote(name))
	}
	return err
}

// shellQuote quotes s for a shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
