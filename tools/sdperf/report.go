package main

import (
	"fmt"
	"io"
)

// Perftest's table formats (perftest_parameters.h, before its 2024 switch
// from "MB/sec" to "MiB/sec": the unit was and is 2^20 bytes).
const (
	resultLine   = "---------------------------------------------------------------------------------------\n"
	resultFmtLat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	resultFmtBW  = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	reportFmtLat = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	reportFmtBW  = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n"
)

// info is what the banner block shows.
type info struct {
	server      bool
	local, peer params
	localPID    int
	peerPID     int
	localRead   bool
	peerRead    bool
	maxInline   int
}

// printInfo writes perftest's banner block and the two addresses.
func printInfo(w io.Writer, in *info) {
	k := in.local.test
	fmt.Fprint(w, resultLine)
	fmt.Fprintf(w, "                    %s\n", k.title())
	if in.local.flags&flagEvents != 0 {
		fmt.Fprintf(w, " Test with events.\n")
	}
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : sandirect-%s\n", memoryName(in.local.flags))
	fmt.Fprintf(w, " Number of qps   : 1\t\tTransport type : sandirect nic (shared memory)\n")
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	if !in.server || k.lat() && !k.read() {
		tx := 1
		if !k.lat() {
			tx = txDepthBW
		}
		fmt.Fprintf(w, " TX depth        : %d\n", tx)
	}
	if k.send() {
		fmt.Fprintf(w, " RX depth        : %d\n", rxDepthSend)
	}
	if !k.lat() {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", cqMod)
	}
	if k.read() {
		out := 1
		if !k.lat() {
			out = txDepthBW
		}
		fmt.Fprintf(w, " Outstand reads  : %d\n", out)
	} else {
		fmt.Fprintf(w, " Max inline data : %d[B]\n", in.maxInline)
	}
	fmt.Fprintf(w, " RDMA Read       : %s (peer: %s)\n", onOff(in.localRead), onOff(in.peerRead))
	fmt.Fprintf(w, " Completion wait : %s\n", waitName(in.local.flags))
	fmt.Fprintf(w, " Data ex. method : QP send\n")
	fmt.Fprint(w, resultLine)
	fmt.Fprintf(w, " local address: PID %d Memory %s RKey %#08x VAddr %#016x\n", in.localPID, memoryName(in.local.flags), in.local.rkey, in.local.bufAddr)
	fmt.Fprintf(w, " remote address: PID %d Memory %s RKey %#08x VAddr %#016x\n", in.peerPID, memoryName(in.peer.flags), in.peer.rkey, in.peer.bufAddr)
	fmt.Fprint(w, resultLine)
	if in.server && k == sendBW {
		fmt.Fprintf(w, " WARNING: BW peak won't be measured in this run.\n")
	}
	if k.lat() {
		fmt.Fprint(w, resultFmtLat)
	} else {
		fmt.Fprint(w, resultFmtBW)
	}
}

func printRow(w io.Writer, r *row) {
	if r.kind == rowLat {
		fmt.Fprintf(w, reportFmtLat, r.size, r.iters, r.v[0], r.v[1], r.v[2], r.v[3], r.v[4], r.v[5], r.v[6])
		return
	}
	fmt.Fprintf(w, reportFmtBW, r.size, r.iters, r.v[0], r.v[1], r.v[2])
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

func waitName(flags uint8) string {
	if flags&flagEvents != 0 {
		return "events (-e)"
	}
	return "busy poll"
}
