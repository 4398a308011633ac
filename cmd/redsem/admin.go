//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/redsem/redsem/admin"
)

const resizeHelp = `Usage: redsem resize [connection flags] NAME N

Sets the size of semaphore NAME to N for every client at once (and creates
it if it does not exist). Growing serves waiters at once; shrinking retires
the slots above N: free ones now, held ones when their holders give them
back. Clients started with another --size then get exit code 65 until they
use N; the library's WithAdoptSize follows resizes instead.

` + connHelp + `
Example:
  redsem resize encoders 8
`

const checkHelp = `Usage: redsem check [--json] [connection flags] NAME

Reads where every slot of semaphore NAME is (free, pending, leased, retired)
and lists duplicates, strangers (forged or stale tokens) and missing slots.
Exits 0 when healthy, 65 when not.

  --json           print the inventory as JSON: snake_case keys, lists never
                   null, slots as numbers (the same style as status --json)
  --all            check every semaphore under --prefix instead of NAME
                   (see redsem check --all --help)

` + connHelp + `
Example:
  redsem check encoders || redsem repair encoders
`

const repairHelp = `Usage: redsem repair [connection flags] NAME

Restores semaphore NAME's tokens: reclaims what expired, drops strangers and
duplicate copies, and mints missing slots again, but only while no slot is
held or in flight (a missing slot might still be held); otherwise it says
what blocks it and exits 65. After Redis lost lease records (eviction, a
failover), wait one lease TTL before repairing.

` + connHelp + `
Example:
  redsem repair encoders
`

func cmdResize(args []string, stdout, _ io.Writer) error {
	return adminCommand("resize", resizeHelp, args, 2, nil, func(ctx context.Context, adm *admin.Handle, pos []string) error {
		n, err := strconv.Atoi(pos[1])
		if err != nil || n < 1 {
			return usagef("resize: N must be a whole number of at least 1, not %q", pos[1])
		}
		if err := adm.Resize(ctx, n); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%q now has %d slot(s)\n", pos[0], n)
		return nil
	})
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	if wantsCheckAll(args) {
		return cmdCheckAll(args, stdout, stderr)
	}
	var asJSON *bool
	flags := func(fs *flag.FlagSet) { asJSON = fs.Bool("json", false, "") }
	return adminCommand("check", checkHelp, args, 1, flags, func(ctx context.Context, adm *admin.Handle, pos []string) error {
		inv, err := adm.Check(ctx)
		if err != nil {
			return err
		}
		healthy := inv.Healthy()
		if *asJSON {
			if err := writeJSON(stdout, toCheckJSON(inv)); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "%s: size %d, free %d, pending %d, leased %d, withheld %d, retired %d, duplicates %d, strangers %d, missing %v\n",
				pos[0], inv.Size, len(inv.Free), len(inv.Pending), len(inv.Leased), len(inv.Withheld), len(inv.Retired),
				len(inv.Duplicates), len(inv.Strangers), inv.Missing)
		}
		if !healthy {
			return exitf(exitData, "")
		}
		return nil
	})
}

func cmdRepair(args []string, stdout, _ io.Writer) error {
	return adminCommand("repair", repairHelp, args, 1, nil, func(ctx context.Context, adm *admin.Handle, pos []string) error {
		rep, err := adm.Repair(ctx)
		if err != nil && !errors.Is(err, admin.ErrRepairUnsafe) {
			return err // nothing was repaired: no report that looks like one
		}
		fmt.Fprintf(stdout, "%s: reclaimed %d, dropped %d, minted %d, still missing %v\n",
			pos[0], rep.Reclaimed, len(rep.Dropped), len(rep.Minted), rep.Missing)
		if errors.Is(err, admin.ErrRepairUnsafe) {
			return exitf(exitData, "%v", err)
		}
		return err
	})
}

// adminCommand is the frame of the commands that act on one semaphore: it
// parses the connection flags, the command's own (added by flags, may be
// nil) and want positional arguments, the first of them NAME; opens NAME;
// and runs do on its Admin under a context bounded by opTimeout.
func adminCommand(cmd, help string, args []string, want int, flags func(*flag.FlagSet),
	do func(ctx context.Context, adm *admin.Handle, pos []string) error) error {
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
	adm, p, err := openAdmin(c, pos[0])
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return do(ctx, adm, pos)
}
