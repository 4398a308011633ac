//go:build unix

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/redsem/redsem/admin"
)

const deleteHelp = `Usage: redsem delete --force [-v] [connection flags] NAME

Removes every key of NAME, whatever its kind (semaphore, mutex, read-write
lock, rate gate, election: all of them when NAME names several) and whatever
the keys' Redis types, so it also clears a name someone else wrote to. Says
what it removed. Current holders lose their leases at their next refresh (a
redsem run holder then stops its command and exits 75, a redsem elect leader
too); blocked waiters keep waiting and are served by what the next acquire
creates afresh. To change a
semaphore's size, use redsem resize instead.

  --force          required: without it, delete only says what it would remove
                   (and exits 64)
  -v, --verbose    list every key removed, with its Redis type

A NAME with no key at all exits 66, with or without --force ("redsem delete
--force NAME || [ $? = 66 ]" in a cleanup script that may run twice).

` + connHelp + `
Example:
  redsem delete --force encoders
`

func cmdDelete(args []string, stdout, _ io.Writer) error {
	var force, verbose bool
	flags := func(fs *flag.FlagSet) {
		fs.BoolVar(&force, "force", false, "")
		for _, n := range []string{"v", "verbose"} {
			fs.BoolVar(&verbose, n, false, "")
		}
	}
	return adminCommand("delete", deleteHelp, args, 1, flags, func(ctx context.Context, n *named, _ []string) error {
		keys, err := n.adm.Keys(ctx)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return exitf(exitNoName, "delete: no key of %q under prefix %q; nothing to delete", n.name, n.prefix)
		}
		if !force {
			return usagef("delete: %s; add --force to delete %s", describeName(ctx, n), keyCount(len(keys)))
		}
		gone, err := n.adm.Purge(ctx)
		if err != nil {
			return err
		}
		if len(gone) == 0 {
			return exitf(exitNoName, "delete: no key of %q under prefix %q; nothing to delete", n.name, n.prefix)
		}
		fmt.Fprintf(stdout, "deleted %q: %s\n", n.name, removedSummary(gone))
		if verbose {
			for _, k := range gone {
				fmt.Fprintf(stdout, "  %s (%s)\n", k.Key, k.Type)
			}
		}
		return nil
	})
}

func keyCount(n int) string {
	if n == 1 {
		return "its 1 key"
	}
	return fmt.Sprintf("its %d keys", n)
}

// removedSummary says what was removed, by layout: "semaphore (5 keys),
// rwmutex (1 key including redsem:{x}:rw:meta, a string)". Keys of another
// type than the layout gives them are named.
func removedSummary(keys []admin.Key) string {
	var parts []string
	for _, k := range []admin.Kind{admin.KindSemaphore, admin.KindRWMutex, admin.KindRate, admin.KindElection} {
		n := 0
		var odd []string
		for _, key := range keys {
			if key.Kind != k {
				continue
			}
			n++
			if key.Type != expectedType(key.Key) {
				odd = append(odd, fmt.Sprintf("%s, a %s", key.Key, key.Type))
			}
		}
		if n == 0 {
			continue
		}
		part := fmt.Sprintf("%s (%d key", k, n)
		if n != 1 {
			part += "s"
		}
		if len(odd) > 0 {
			part += " including " + strings.Join(odd, "; ")
		}
		parts = append(parts, part+")")
	}
	return strings.Join(parts, ", ")
}

// describeName says what NAME is, for delete without --force: each kind
// that exists with its holders and waiters, as far as its keys are readable.
func describeName(ctx context.Context, n *named) string {
	var parts []string
	for _, k := range n.kinds {
		switch k {
		case admin.KindSemaphore:
			st, err := n.adm.Status(ctx)
			if err != nil {
				parts = append(parts, fmt.Sprintf("a semaphore whose keys cannot be read (%s)", oneLine(err)))
				continue
			}
			parts = append(parts, fmt.Sprintf("a %s of size %d with %d holder(s) and %d waiter(s)",
				semKind(st.Size), st.Size, len(st.Holders), st.Waiting))
		case admin.KindRWMutex:
			st, err := n.adm.RWStatus(ctx)
			if err != nil {
				parts = append(parts, fmt.Sprintf("a read-write lock whose keys cannot be read (%s)", oneLine(err)))
				continue
			}
			parts = append(parts, fmt.Sprintf("a read-write lock with %d holder(s) and %d waiter(s)",
				len(rwHolders(st)), len(st.Queue)))
		case admin.KindRate:
			parts = append(parts, "a rate gate")
		case admin.KindElection:
			st, err := n.adm.ElectionStatus(ctx)
			if err != nil {
				parts = append(parts, fmt.Sprintf("an election whose keys cannot be read (%s)", oneLine(err)))
				continue
			}
			leader := "nobody leads"
			if st.Leader != nil {
				leader = fmt.Sprintf("%s leads, term %d", st.Value, st.Leader.Fence)
			}
			parts = append(parts, fmt.Sprintf("an election (%s) with %d campaigner(s) waiting and %d observer(s)",
				leader, st.Waiting, st.Observers))
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%q has keys but no meta record (left over, or written by someone else)", n.name)
	}
	return fmt.Sprintf("%q is %s", n.name, strings.Join(parts, " and "))
}

// expectedType is the Redis type redsem's layouts give a key, by the last
// part of its name.
func expectedType(key string) string {
	i := strings.LastIndexByte(key, '}')
	rest := strings.TrimPrefix(strings.TrimPrefix(key[i+1:], ":"), "rw:")
	rest = strings.TrimPrefix(rest, "rate:")
	if el, ok := strings.CutPrefix(rest, "el:"); ok {
		switch el {
		case "leader":
			return "hash"
		case "log":
			return "list"
		case "observers":
			return "zset"
		}
		rest = el // its mutex's keys: a semaphore's
	}
	field, _, _ := strings.Cut(rest, ":")
	switch field {
	case "meta", "holders":
		return "hash"
	case "leases", "waits", "log":
		return "zset"
	}
	return "list" // tokens, queue, wqueue, pend:, bell:, part:, in:
}
