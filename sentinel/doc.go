// Package sentinel lets redsem semaphores and mutexes run on a Redis master
// watched by Redis Sentinel, and follow its failovers without a restart.
//
// A Pool is a connection source built on redigo. It satisfies redsem.Pool,
// so the semaphore API does not change:
//
//	p, err := sentinel.New(ctx, []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, "mymaster",
//		sentinel.WithDialOptions(redis.DialPassword(pw)))
//	if err != nil { ... }
//	defer p.Close()
//	sem, err := redsem.NewSemaphore(p, "reports", 10)
//
// # Finding the master
//
// The Pool asks every sentinel SENTINEL MASTER <name> and takes the address
// named by the one with the highest config epoch (a sentinel that has not
// heard of the last failover yet names the old master). Every connection it
// dials to that address must answer ROLE as a master: a demoted master keeps
// answering commands until it learns of the failover. While no master can
// be reached, GetContext (and New) wait, within the caller's context and
// WithFailoverWait (default 30s), instead of failing at once; an AUTH or ACL
// refusal fails at once.
//
// # Following a failover
//
// The Pool subscribes to every sentinel and acts on three events:
//
//   - +try-failover: a sentinel starts a failover of the master. The Pool
//     stops using it at once: every connection to it, idle or in use, is
//     closed, and GetContext waits. This happens before the sentinel
//     promotes a replica, so no write of this Pool reaches the old master
//     after the promotion. Until the failover ends, sentinels report it in
//     progress and the Pool keeps waiting.
//   - +promoted-slave: the chosen replica answers as a master; the Pool
//     uses it (checking ROLE again on each new connection).
//   - +switch-master: the sentinels name the new master; the Pool uses it.
//
// The Pool also asks the sentinels again after a connection to the master
// fails and after an error reply that means the node was demoted (READONLY,
// UNBLOCKED, MASTERDOWN). Those replies come back as a *FailoverError, which
// deliberately is not a redis.Error, so that redsem treats the call as
// broken: a blocked Acquire settles its acquisition by id on a fresh
// connection (to the new master) and waits again within its context. It
// loses its place in the FIFO queue.
//
// # Guarantees
//
// Sentinel failovers are not coordinated with the clients: Redis
// replication is asynchronous, and a promoted replica may lack the old
// master's last writes.
//
//   - A failover of a master that is up (SENTINEL FAILOVER, or one started
//     because the sentinels lost sight of it) keeps the semaphore
//     guarantees when the Pool hears the leading sentinel's +try-failover
//     (it subscribes to all of them): the Pool leaves the old master before
//     the promotion, and its writes there have reached the replicas by then
//     on a healthy link. Clients pause for the failover (about one second
//     in the tests). A Pool that misses the event (its link to that
//     sentinel down) keeps writing to the old master until it is demoted,
//     and those writes are lost as in a crash.
//   - A crash or a partition of the master loses its writes that no
//     replica had received. For a semaphore that means, as in the cluster
//     package: a lost acquisition (the token is free again on the new
//     master and may be granted while its first holder still works: a token
//     with two holders, more than N holders for up to one lease TTL; the
//     first holder's Release and Refresh then fail with redsem.ErrLeaseLost
//     and add no token); a lost release (the token stays leased until its
//     TTL: a delay); a lost creation (a new epoch; old holders get
//     ErrLeaseLost). A master partitioned from the sentinels, with clients
//     on its side, keeps accepting writes until it is demoted; set
//     min-replicas-to-write on the master to bound that. Use Lease.Fence
//     where overlap matters. No token stays lost for longer than one lease
//     TTL plus the grace.
//
// # WAIT
//
// WithWait(replicas, timeout) follows every write, and every pipeline that
// holds one, with WAIT replicas timeout on the same connection. An Acquire
// that returns a lease then had its grant on at least that many replicas,
// and a Release that returns nil had its release there; otherwise the call
// fails with an error matching ErrNotReplicated (the write happened on the
// master: Acquire settles it, Release may be called again). Sentinel
// promotes the replica with the largest replication offset it knows of, so
// with replicas set to all of them an acknowledged grant survives a crash.
// WAIT narrows the window; it does not close it: with fewer replicas than
// that, the one promoted may not be one that acknowledged (the sentinels'
// view of offsets is up to a second old); a partitioned master with a
// replica on its side still acknowledges; WAIT says nothing about disk; and
// while replicas are missing every write fails, so set replicas to what the
// topology keeps after losing a node.
//
// # Connections
//
// WithDialOptions applies to the data nodes, WithSentinelDialOptions to the
// sentinels: a password, an ACL user, TLS on either side. Every blocked
// Acquire holds one connection while it waits: size WithPoolSize for your
// waiters, or give blocked Acquires their own Pool with
// redsem.WithBlockingPool. Leave the read timeout at 0 or above 32s (redsem
// blocks up to 30s). Tested against redis-server 7.0 with one master, two
// replicas and three sentinels on loopback.
package sentinel
