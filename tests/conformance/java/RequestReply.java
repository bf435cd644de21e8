// A Java 4.9.4 requester and responder talking through the name server and broker at args[0]
// on topic args[1] (tests/conformance/test_java_request_reply.py runs it against pymq).
// args[2]: "pair" (both, in one JVM), "responder" (answer args[3] requests, then stop) or
// "requester" (the callback request alone).
// Prints one line per outcome: REPLY_SENT/REPLY_FAILED (the responder's send of each reply,
// whose status tells whether the broker could push it to the requester), SYNC_RESULT
// (DefaultMQProducer.request(msg, timeout)), CALLBACK_RESULT (request(msg, callback, timeout)),
// then DONE.

import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.RequestCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public class RequestReply {
    static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    static String describe(Message msg) {
        return "body=" + text(msg.getBody()) + " type=" + msg.getProperty("MSG_TYPE")
            + " corr=" + msg.getProperty("CORRELATION_ID") + " topic=" + msg.getTopic();
    }

    static String oneLine(Exception e) {
        return e.toString().replace('\n', ' ');
    }

    /** A push consumer answering each request with "re:<body>" through its own producer. */
    static final class Responder {
        final DefaultMQProducer replier = new DefaultMQProducer("JavaReplyPG");
        final DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("JavaResponderCG");

        Responder(String namesrv, String topic, CountDownLatch replied) throws Exception {
            replier.setNamesrvAddr(namesrv);
            replier.setInstanceName("responder");
            replier.start();
            consumer.setNamesrvAddr(namesrv);
            consumer.setInstanceName("responder");
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
                for (MessageExt msg : msgs) {
                    try {
                        byte[] body = ("re:" + text(msg.getBody())).getBytes(StandardCharsets.UTF_8);
                        SendResult result = replier.send(MessageUtil.createReplyMessage(msg, body), 5000);
                        System.out.println("REPLY_SENT " + result.getSendStatus()
                            + " corr=" + msg.getProperty("CORRELATION_ID"));
                    } catch (Exception e) {
                        System.out.println("REPLY_FAILED " + oneLine(e));
                    }
                    replied.countDown();
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            System.out.println("RESPONDER_STARTED");
        }

        void shutdown() {
            consumer.shutdown();
            replier.shutdown();
        }
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        String mode = args[2];

        if (mode.equals("responder")) {
            CountDownLatch replied = new CountDownLatch(Integer.parseInt(args[3]));
            Responder responder = new Responder(namesrv, topic, replied);
            boolean all = replied.await(60, TimeUnit.SECONDS);
            Thread.sleep(500);
            responder.shutdown();
            System.out.println(all ? "DONE" : "RESPONDER_TIMEOUT");
            System.exit(0);
        }
        // In pair mode the responder answers both requests; its send of each reply returns
        // only once the broker has pushed that reply to the requester, so it can finish after
        // the requester has its answer: DONE waits for both REPLY_ lines, not a fixed sleep.
        CountDownLatch pairReplied = new CountDownLatch(2);
        Responder responder = mode.equals("pair") ? new Responder(namesrv, topic, pairReplied) : null;

        DefaultMQProducer requester = new DefaultMQProducer("JavaRequestPG");
        requester.setNamesrvAddr(namesrv);
        requester.setInstanceName("requester");
        requester.start();

        if (responder != null) {
            Message sync = new Message(topic, "q-sync".getBytes(StandardCharsets.UTF_8));
            try {
                Message got = requester.request(sync, 15000);
                System.out.println("SYNC_RESULT " + describe(got) + " same=" + (got == sync)
                    + " sent_corr=" + sync.getProperty("CORRELATION_ID"));
            } catch (Exception e) {
                System.out.println("SYNC_FAILED " + oneLine(e));
            }
        }

        Message asked = new Message(topic, "q-cb".getBytes(StandardCharsets.UTF_8));
        AtomicReference<Message> reply = new AtomicReference<>();
        CountDownLatch done = new CountDownLatch(1);
        requester.request(asked, new RequestCallback() {
            @Override
            public void onSuccess(Message message) {
                // 4.9.4 calls this with null once the request is stored, then with the reply.
                if (message != null && reply.compareAndSet(null, message)) {
                    done.countDown();
                }
            }

            @Override
            public void onException(Throwable e) {
                System.out.println("CALLBACK_FAILED " + e.toString().replace('\n', ' '));
                done.countDown();
            }
        }, 15000);
        if (done.await(20, TimeUnit.SECONDS) && reply.get() != null) {
            System.out.println("CALLBACK_RESULT " + describe(reply.get())
                + " sent_corr=" + asked.getProperty("CORRELATION_ID"));
        } else {
            System.out.println("CALLBACK_TIMEOUT");
        }
        if (responder != null && !pairReplied.await(30, TimeUnit.SECONDS)) {
            System.out.println("RESPONDER_TIMEOUT");
        }
        requester.shutdown();
        if (responder != null) {
            responder.shutdown();
        }
        System.out.println("DONE");
        System.exit(0);
    }
}
