package main

import "syscall"

// childAttr puts the command in its own process group, so that signals reach
// everything it starts, and has Linux send it SIGKILL if redsem dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
