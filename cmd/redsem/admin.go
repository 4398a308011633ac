//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

const resizeHelp = `Usage: redsem resize [--create] [connection flags] NAME N

Sets the size of semaphore (or mutex) NAME to N for every client at once.
Growing serves waiters at once; shrinking retires the slots above N: free
ones now, held ones when their holders give them back. Clients started with
another --size then get exit code 65 until they use N; the library's
WithAdoptSize follows resizes instead.

A NAME that does not exist is an error (exit 66), so that a typo does not
make a semaphore; --create makes it. A read-write lock or a rate gate has no
size: resize refuses them (exit 65; a rate gate's limits are changed with
redsem rate set).

  --create         make semaphore NAME with N slots if it does not exist

` + connHelp + `
Examples:
  redsem resize encoders 8
  redsem resize --create encoders 4
`

const checkHelp = `Usage: redsem check [--json] [--kind K] [connection flags] NAME
       redsem check --server [connection flags]

Checks NAME, whatever its kind, and prints one line; exits 0 when healthy, 65
when not, 66 when NAME does not exist.
  semaphore, mutex  where every slot is (free, pending, leased, withheld,
                    retired), duplicates, strangers (forged or stale tokens)
                    and missing slots; healthy when every slot is in one place
  rwmutex           its readers, writer and queue; healthy when readable
  rate              its limits and starts; healthy when its grant logs hold
                    no stray entry

  --json           print the report as JSON: snake_case keys, "kind" always,
                   lists never null, slots as numbers (the style of status)
  --kind K         semaphore (or mutex), rwmutex or rate: which one when NAME
                   names several (default: the first of them in that order)
  --all            check every name under --prefix instead of NAME
                   (see redsem check --all --help)
  --server         check the Redis server instead of NAME: version 6.2 or
                   later, and a maxmemory-policy that never evicts keys
                   without a TTL (noeviction or volatile-*); exit 65 naming
                   what is wrong, 69 when the user may not send INFO

` + connHelp + `
Example:
  redsem check encoders || redsem repair encoders
`

const repairHelp = `Usage: redsem repair [connection flags] NAME

Restores semaphore (or mutex) NAME's tokens: reclaims what expired, drops
strangers and duplicate copies, and mints missing slots again, but only while
no slot is held or in flight (a missing slot might still be held); otherwise
it says what blocks it and exits 65. After Redis lost lease records
(eviction, a failover), wait one lease TTL before repairing. A read-write
lock and a rate gate have no tokens to repair: repair refuses them (exit 65).
A NAME that does not exist exits 66.

` + connHelp + `
Example:
  redsem repair encoders
`

func cmdResize(args []string, stdout, _ io.Writer) error {
	var create *bool
	flags := func(fs *flag.FlagSet) { create = fs.Bool("create", false, "") }
	var size int
	check := func(pos []string) error {
		n, err := strconv.Atoi(pos[1])
		if err != nil || n < 1 || n > redsem.MaxSize {
			return usagef("resize: N must be a whole number from 1 to %d, not %q", redsem.MaxSize, pos[1])
		}
		size = n
		return nil
	}
	return adminCommandCheck("resize", resizeHelp, args, 2, flags, check, func(ctx context.Context, n *named, _ []string) error {
		if !n.has(admin.KindSemaphore) {
			switch {
			case *create:
			case n.has(admin.KindRWMutex):
				return notFor("resize", n.name, admin.KindRWMutex, "a lock has no size; resize applies to a semaphore or mutex (--create makes a semaphore of that name beside it)")
			case n.has(admin.KindRate):
				return notFor("resize", n.name, admin.KindRate, fmt.Sprintf("change its limits with redsem rate set %s N/PER", shellQuote(n.name)))
			case n.has(admin.KindElection):
				return notFor("resize", n.name, admin.KindElection, "an election has one seat; resize applies to a semaphore or mutex (--create makes a semaphore of that name beside it)")
			default:
				return exitf(exitNoName, "resize: no semaphore %q under prefix %q (resize --create %s %d makes one)",
					n.name, n.prefix, shellQuote(n.name), size)
			}
		}
		// Between the look-up and the resize the name could be deleted, and
		// the resize would then create it: a window of one round trip.
		if err := n.adm.Resize(ctx, size); err != nil {
			return err
		}
		if !n.has(admin.KindSemaphore) {
			fmt.Fprintf(stdout, "created %s %q with %d slot(s)\n", semKind(size), n.name, size)
			return nil
		}
		fmt.Fprintf(stdout, "%q now has %d slot(s)\n", n.name, size)
		return nil
	})
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	if wantsFlag(args, "all") {
		return cmdCheckAll(args, stdout, stderr)
	}
	if wantsFlag(args, "server") {
		return cmdCheckServer(args, stdout)
	}
	var asJSON *bool
	var kind *kindFlag
	flags := func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "")
		kind = registerKind(fs)
	}
	return adminCommand("check", checkHelp, args, 1, flags, func(ctx context.Context, n *named, _ []string) error {
		k, ok := n.pick(kind.k)
		if !ok {
			if kind.k != "" && len(n.kinds) > 0 {
				return exitf(exitNoName, "check: no %s %q under prefix %q (%s)", kindWords(kind.k), n.name, n.prefix,
					alsoLine(n.name, n.kinds))
			}
			return n.noSuchName(ctx, "check")
		}
		c, err := checkKind(ctx, n, k)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := writeJSON(stdout, c.doc); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(stdout, c.line)
			if others := n.others(k); len(others) > 0 && kind.k == "" {
				fmt.Fprintln(stdout, alsoLine(n.name, others))
			}
		}
		if !c.healthy {
			return exitf(exitData, "")
		}
		return nil
	})
}

// cmdCheckServer is "redsem check --server": admin.CheckServer.
func cmdCheckServer(args []string, stdout io.Writer) error {
	fs := newFlagSet("check")
	var c connFlags
	c.register(fs)
	fs.Bool("server", false, "")
	pos, err := parseArgs(fs, args, checkHelp)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("check: --server takes no NAME, got %q", strings.Join(pos, " "))
	}
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	switch err := admin.CheckServer(ctx, p.main); {
	case errors.Is(err, admin.ErrEvictingServer), errors.Is(err, admin.ErrServerTooOld):
		return exitf(exitData, "Redis at %s: %s", p.shown, strings.TrimPrefix(err.Error(), "redsem: "))
	case errors.Is(err, admin.ErrNotChecked):
		return exitf(exitUnavailable, "Redis at %s: %s", p.shown, strings.TrimPrefix(err.Error(), "redsem: "))
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "Redis at %s: version 6.2 or later, maxmemory-policy keeps keys without a TTL: fit for redsem\n", p.shown)
	return nil
}

func cmdRepair(args []string, stdout, _ io.Writer) error {
	return adminCommand("repair", repairHelp, args, 1, nil, func(ctx context.Context, n *named, _ []string) error {
		if !n.has(admin.KindSemaphore) {
			if len(n.kinds) == 0 {
				return n.noSuchName(ctx, "repair")
			}
			return notFor("repair", n.name, n.kinds[0], "repair applies to a semaphore or mutex, whose tokens can go missing; "+
				"redsem check "+shellQuote(n.name)+" shows its state, redsem delete --force removes it")
		}
		rep, err := n.adm.Repair(ctx)
		if err != nil && !errors.Is(err, admin.ErrRepairUnsafe) {
			return err // nothing was repaired: no report that looks like one
		}
		fmt.Fprintf(stdout, "%q: reclaimed %d, dropped %d, minted %d, still missing %s\n",
			n.name, rep.Reclaimed, len(rep.Dropped), len(rep.Minted), slotList(rep.Missing))
		if errors.Is(err, admin.ErrRepairUnsafe) {
			return exitf(exitData, "%v", err)
		}
		return err
	})
}

// adminCommand is the frame of the commands that act on one name: it
// parses the connection flags, the command's own (added by flags, may be
// nil) and want positional arguments, the first of them NAME; looks up
// which kinds exist under NAME; and runs do under a context bounded by
// opTimeout. An error about a key of the wrong type says how to clear it.
func adminCommand(cmd, help string, args []string, want int, flags func(*flag.FlagSet),
	do func(ctx context.Context, n *named, pos []string) error) error {
	return adminCommandCheck(cmd, help, args, want, flags, nil, do)
}

// adminCommandCheck is adminCommand with check run on the positional
// arguments before anything is dialled.
func adminCommandCheck(cmd, help string, args []string, want int, flags func(*flag.FlagSet),
	check func(pos []string) error, do func(ctx context.Context, n *named, pos []string) error) error {
	fs := newFlagSet(cmd)
	var c connFlags
	c.register(fs)
	if flags != nil {
		flags(fs)
	}
	pos, err := parseArgs(fs, args, help)
	if err != nil {
		return err
	}
	if want == 1 {
		name, err := oneName(cmd, pos)
		if err != nil {
			return err
		}
		pos = []string{name}
	} else if len(pos) != want {
		return usagef("%s: %d arguments expected, got %d (see redsem %s --help)", cmd, want, len(pos), cmd)
	}
	if check != nil {
		if err := check(pos); err != nil {
			return err
		}
	}
	adm, p, err := openAdmin(c, pos[0])
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	kinds, err := adm.Kinds(ctx)
	if err != nil {
		return err
	}
	n := &named{adm: adm, pool: p.main, prefix: c.prefix, name: pos[0], kinds: kinds}
	return wrongTypeHint(do(ctx, n, pos), pos[0])
}
