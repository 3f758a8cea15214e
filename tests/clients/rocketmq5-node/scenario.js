// One role of a test scenario, played by the official RocketMQ 5 Node.js client, unmodified (from
// .venv/opt/rocketmq5-node, which scripts/venv.sh dev installs from package-lock.json beside this
// file). Arguments are JSON on stdin; the result is one JSON line on stdout.
//
//   produce      {endpoint, ak, sk, namespace, topic, messages: [{body, tag, keys, group, delayMs}]}
//                -> {sent: [{messageId, recallHandle}]}
//   recall       {..., topic, handle}                          -> {messageId}
//   simple       {..., group, topic, tag, count, invisibleMs, ack, changeInvisibleMs, timeoutMs}
//                -> {received: [{messageId, body, tag, keys, attempt, group, at}]}
//   push         {..., group, topic, tag, count, failFirst, timeoutMs} -> {consumed: [...]}
//   transaction  {..., topic, messages: [{body, resolution}], check, checkWaitMs} -> {sent, checked}
//   error        {..., topic, call}                            -> {error}
'use strict';

const {
  Producer, SimpleConsumer, PushConsumer, FilterExpression, ConsumeResult,
} = require('rocketmq-client-nodejs');

function options(a) {
  const o = { endpoints: a.endpoint, namespace: a.namespace || '', requestTimeout: 5000 };
  if (a.ak) o.sessionCredentials = { accessKey: a.ak, accessSecret: a.sk };
  return o;
}

function shown(m) {
  return {
    messageId: m.messageId,
    body: m.body.toString(),
    tag: m.tag || null,
    keys: [...(m.keys || [])].sort(),
    attempt: m.deliveryAttempt,
    group: m.messageGroup || null,
    at: Date.now() / 1000,
  };
}

async function produce(a) {
  const p = new Producer({ ...options(a), topic: a.topic });
  await p.startup();
  try {
    const sent = [];
    for (const s of a.messages) {
      const msg = { topic: a.topic, body: Buffer.from(s.body) };
      if (s.tag) msg.tag = s.tag;
      if (s.keys) msg.keys = s.keys;
      if (s.group) msg.messageGroup = s.group;
      if (s.delayMs) msg.delay = s.delayMs;
      const r = await p.send(msg);
      sent.push({ messageId: r.messageId, recallHandle: r.recallHandle || null });
    }
    return { sent };
  } finally {
    await p.shutdown();
  }
}

async function recall(a) {
  const p = new Producer({ ...options(a), topic: a.topic });
  await p.startup();
  try {
    const r = await p.recallMessage(a.topic, a.handle);
    return { messageId: r.messageId };
  } finally {
    await p.shutdown();
  }
}

async function simple(a) {
  const subs = new Map().set(a.topic, new FilterExpression(a.tag || '*'));
  const c = new SimpleConsumer({ ...options(a), consumerGroup: a.group, subscriptions: subs, awaitDuration: 2000 });
  await c.startup();
  const received = [];
  try {
    const deadline = Date.now() + (a.timeoutMs || 20000);
    while (received.length < a.count && Date.now() < deadline) {
      const msgs = await c.receive(Math.min(32, a.count - received.length), a.invisibleMs || 15000);
      for (const m of msgs) {
        received.push(shown(m));
        if (a.changeInvisibleMs != null) await c.changeInvisibleDuration(m, a.changeInvisibleMs);
        if (a.ack !== false) await c.ack(m);
      }
    }
    return { received };
  } finally {
    await c.shutdown();
  }
}

async function push(a) {
  const consumed = [];
  const succeeded = new Set();
  const failures = new Map();
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  const listener = {
    consume(m) {
      consumed.push(shown(m));
      const n = failures.get(m.messageId) || 0;
      if (n < (a.failFirst || 0)) {
        failures.set(m.messageId, n + 1);
        return ConsumeResult.FAILURE;
      }
      succeeded.add(m.messageId);
      if (succeeded.size >= a.count) finish();
      return ConsumeResult.SUCCESS;
    },
  };
  const subs = new Map().set(a.topic, new FilterExpression(a.tag || '*'));
  const c = new PushConsumer({ ...options(a), consumerGroup: a.group, subscriptions: subs, messageListener: listener });
  await c.startup();
  await Promise.race([done, new Promise((r) => setTimeout(r, a.timeoutMs || 30000))]);
  await new Promise((r) => setTimeout(r, 500)); // the last acknowledgements leave
  // (no shutdown: it waits out the receives in flight, a long-poll each; the process ends instead)
  return { consumed };
}

async function transaction(a) {
  const checked = [];
  const verdict = a.check === 'commit' ? 1 : 2; // TransactionResolution COMMIT / ROLLBACK
  const checker = {
    async check(m) {
      checked.push(m.messageId);
      return verdict;
    },
  };
  const p = new Producer({ ...options(a), topic: a.topic, checker });
  await p.startup();
  try {
    const sent = [];
    for (const s of a.messages) {
      const tx = p.beginTransaction();
      const r = await p.send({ topic: a.topic, body: Buffer.from(s.body) }, tx);
      sent.push({ messageId: r.messageId, transactionId: r.transactionId });
      if (s.resolution === 'commit') await tx.commit();
      else if (s.resolution === 'rollback') await tx.rollback();
    }
    const want = a.messages.filter((s) => s.resolution === 'none').length;
    const deadline = Date.now() + (a.checkWaitMs || 0);
    while (new Set(checked).size < want && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    if (want) await new Promise((r) => setTimeout(r, 500)); // the check's EndTransaction leaves
    return { sent, checked: [...new Set(checked)].sort() };
  } finally {
    await p.shutdown();
  }
}

async function error(a) {
  try {
    if (a.call === 'send') await produce({ messages: [{ body: 'x' }], ...a });
    else if (a.call === 'recall') await recall(a);
    else await simple({ count: 1, timeoutMs: 3000, ...a });
  } catch (e) {
    return { error: `${e.name}: ${e.message}` };
  }
  return { error: null };
}

const ROLES = { produce, recall, simple, push, transaction, error };

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const result = await ROLES[process.argv[2]](JSON.parse(Buffer.concat(chunks).toString()));
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
