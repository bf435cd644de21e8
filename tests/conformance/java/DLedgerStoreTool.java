// pymq's cross-check of DLedger 0.2.6's file store (tests/conformance/test_java_dledger_store.py).
//
//   write <baseDir> <dataFileSize> <indexFileSize> <count> <committedIndex>
//       appends <count> entries as leader in term 2 (body of entry i: bodyOf(i)), marks
//       <committedIndex> committed, flushes and writes the checkpoint (as its shutdown)
//   read <baseDir> <dataFileSize> <indexFileSize>
//       loads and recovers the store and prints its state and every entry, one a line
//
// In DLedger's package so that it can use the store as DLedgerServer does.
package io.openmessaging.storage.dledger.store.file;

import io.openmessaging.storage.dledger.DLedgerConfig;
import io.openmessaging.storage.dledger.MemberState;
import io.openmessaging.storage.dledger.entry.DLedgerEntry;
import java.nio.charset.StandardCharsets;

public class DLedgerStoreTool {
    static byte[] bodyOf(long i) {
        StringBuilder sb = new StringBuilder();
        for (long k = 0; k <= i % 7; k++) {
            sb.append("body-").append(i).append(';');
        }
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    static String hex(byte[] data) {
        StringBuilder sb = new StringBuilder();
        for (byte b : data) {
            sb.append(String.format("%02x", b));
        }
        return sb.toString();
    }

    public static void main(String[] args) throws Exception {
        DLedgerConfig config = new DLedgerConfig();
        config.setGroup("g");
        config.setSelfId("n0");
        config.setPeers("n0-127.0.0.1:1");
        config.setStoreBaseDir(args[1]);
        config.setMappedFileSizeForEntryData(Integer.parseInt(args[2]));
        config.setMappedFileSizeForEntryIndex(Integer.parseInt(args[3]));
        MemberState state = new MemberState(config);
        DLedgerMmapFileStore store = new DLedgerMmapFileStore(config, state);
        if (args[0].equals("write")) {
            state.nextTerm();
            state.nextTerm();
            state.setCurrVoteFor("n0");
            state.changeToLeader(2);
            store.load();
            store.recover();
            long count = Long.parseLong(args[4]);
            for (long i = 0; i < count; i++) {
                DLedgerEntry entry = new DLedgerEntry();
                entry.setBody(bodyOf(i));
                store.appendAsLeader(entry);
            }
            store.updateCommittedIndex(2, Long.parseLong(args[5]));
            store.flush();
            store.persistCheckPoint();
        } else {
            store.load();
            store.recover();
            System.out.println("term " + state.currTerm() + " vote " + state.currVoteFor());
            System.out.println("ledger " + store.getLedgerBeginIndex() + " " + store.getLedgerEndIndex()
                + " " + store.getLedgerEndTerm() + " " + store.getCommittedIndex() + " " + store.getCommittedPos());
            for (long i = Math.max(0, store.getLedgerBeginIndex()); i <= store.getLedgerEndIndex(); i++) {
                DLedgerEntry e = store.get(i);
                System.out.println("entry " + e.getIndex() + " " + e.getTerm() + " " + e.getPos() + " "
                    + e.getSize() + " " + e.getMagic() + " " + hex(e.getBody()));
            }
        }
        System.out.flush();
        System.exit(0);
    }
}
