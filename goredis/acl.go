package goredis

import (
	"sort"

	"github.com/redsem/redsem/admin"
)

// adapterCommands are what this package sends on top of redsem's own: a
// blocking wait first asks its connection's CLIENT ID, and a wait whose
// caller gave up is ended with CLIENT UNBLOCK (see the package doc,
// Cancellation).
var adapterCommands = []string{"client|id", "client|unblock"}

// ACLCommands returns the Redis commands redsem sends through a go-redis
// client, lower case and sorted: admin.ACLCommands() and the two
// subcommands this package adds, client|id and client|unblock. A user
// allowed exactly these, on the keys "<prefix>*" and no channel, can run
// every operation of packages redsem, rate and admin's Handle through a
// Pool (the first blocked Acquire fails with NOPERM on client|id without
// them). The same exclusions as admin.ACLCommands apply (INFO, SCAN,
// SELECT); go-redis itself sends HELLO, AUTH and CLIENT SETINFO when it
// connects, which need no permission (CLIENT SETINFO's refusal go-redis
// ignores). docs/acl.md prints the line.
func ACLCommands() []string {
	out := append(admin.ACLCommands(), adapterCommands...)
	sort.Strings(out)
	return out
}
