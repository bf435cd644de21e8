import com.alibaba.fastjson.JSON;
import io.openmessaging.storage.dledger.entry.DLedgerEntry;
import io.openmessaging.storage.dledger.protocol.*;
import java.util.*;
// pymq: DLedger 0.2.6 bodies as fastjson writes them, one a line, for
// tests/unit/test_dledger_protocol.py (JAVA_BODIES) via tests/conformance/test_java_dledger_json.py.
public class DLedgerJsonSamples {
  public static void main(String[] a) {
    VoteRequest v = new VoteRequest(); v.setGroup("g"); v.setLeaderId("n1"); v.setRemoteId("n0"); v.setTerm(3); v.setLedgerEndIndex(10); v.setLedgerEndTerm(2);
    System.out.println(JSON.toJSONString(v));
    System.out.println(JSON.toJSONString(new VoteResponse(v).term(3).voteResult(VoteResponse.RESULT.REJECT_TERM_NOT_READY)));
    System.out.println(JSON.toJSONString(new VoteResponse()));
    HeartBeatRequest h = new HeartBeatRequest(); h.setGroup("g"); h.setLocalId("n0"); h.setRemoteId("n1"); h.setLeaderId("n0"); h.setTerm(5);
    System.out.println(JSON.toJSONString(h));
    System.out.println(JSON.toJSONString(new HeartBeatResponse()));
    System.out.println(JSON.toJSONString(new HeartBeatResponse().term(7).code(403)));
    AppendEntryRequest ap = new AppendEntryRequest(); ap.setGroup("g"); ap.setRemoteId("n0"); ap.setBody("hi\u0000".getBytes());
    System.out.println(JSON.toJSONString(ap));
    AppendEntryResponse ar = new AppendEntryResponse(); ar.setGroup("g"); ar.setIndex(4); ar.setPos(1000); ar.setTerm(2); ar.setLeaderId("n0");
    System.out.println(JSON.toJSONString(ar));
    DLedgerEntry e = new DLedgerEntry(); e.setIndex(4); e.setTerm(2); e.setPos(1000); e.setMagic(1); e.setBody(new byte[]{1,2,3,(byte)255}); e.computeSizeInBytes();
    PushEntryRequest p = new PushEntryRequest(); p.setGroup("g"); p.setRemoteId("n1"); p.setLeaderId("n0"); p.setTerm(2); p.setEntry(e); p.setType(PushEntryRequest.Type.APPEND); p.setCommitIndex(3);
    System.out.println(JSON.toJSONString(p));
    PushEntryRequest pc = new PushEntryRequest(); pc.setGroup("g"); pc.setRemoteId("n1"); pc.setLeaderId("n0"); pc.setTerm(2); pc.setType(PushEntryRequest.Type.COMMIT); pc.setCommitIndex(3);
    System.out.println(JSON.toJSONString(pc));
    PushEntryRequest pb = new PushEntryRequest(); pb.setGroup("g"); pb.setTerm(2); pb.addEntry(e); 
    System.out.println(JSON.toJSONString(pb));
    PushEntryResponse pr = new PushEntryResponse(); pr.setGroup("g"); pr.setTerm(2); pr.setIndex(4L); pr.setBeginIndex(0); pr.setEndIndex(4); pr.setCount(1);
    System.out.println(JSON.toJSONString(pr));
    System.out.println(JSON.toJSONString(new PushEntryResponse()));
    MetadataResponse m = new MetadataResponse(); Map<String,String> peers = new HashMap<>(); peers.put("n0","127.0.0.1:1"); peers.put("n1","127.0.0.1:2"); m.setPeers(peers); m.setLeaderId("n0"); m.setGroup("g");
    System.out.println(JSON.toJSONString(m));
    System.out.println(JSON.toJSONString(new MetadataRequest()));
    GetEntriesRequest g = new GetEntriesRequest(); g.setGroup("g"); g.setBeginIndex(5L); g.setMaxSize(10); g.setIndexList(Arrays.asList(1L,2L));
    System.out.println(JSON.toJSONString(g));
    GetEntriesResponse gr = new GetEntriesResponse(); gr.setEntries(Arrays.asList(e));
    System.out.println(JSON.toJSONString(gr));
    PullEntriesRequest pl = new PullEntriesRequest(); pl.setNodeId("n1"); pl.setBeginIndex(3L); pl.setGroup("g");
    System.out.println(JSON.toJSONString(pl));
    System.out.println(JSON.toJSONString(new PullEntriesResponse()));
    LeadershipTransferRequest lt = new LeadershipTransferRequest(); lt.setGroup("g"); lt.setTransferId("n0"); lt.setTransfereeId("n1"); lt.setTakeLeadershipLedgerIndex(9); lt.setTerm(2);
    System.out.println(JSON.toJSONString(lt));
    System.out.println(JSON.toJSONString(new LeadershipTransferResponse().term(2).code(200)));
  }
}
