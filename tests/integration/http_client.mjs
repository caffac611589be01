// A service outside Python and Ray: Node's built-in fetch against raydelay's HTTP API.
// Run by tests/integration/test_http.py as
//   node http_client.mjs <base url> <token> <topic> <subscription>
// It sends a batch, a raw message and a JSON one, cancels one of the batch by id, puts a
// message under a key twice (the second replaces the first), sends one key twice (the
// second is ignored), cancels another key, reads the topic's stats and the subscription's
// schedule, and prints one JSON line with what it got.

const [url, token, topic, subscription] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${token}` };

async function call(method, path, { json, body, headers } = {}) {
  const reply = await fetch(url + path, {
    method,
    headers: {
      ...auth,
      ...(json !== undefined ? { "Content-Type": "application/json" } : {}),
      ...headers,
    },
    body: json !== undefined ? JSON.stringify(json) : body,
  });
  const text = await reply.text();
  if (!reply.ok) {
    throw new Error(`${method} ${path}: ${reply.status} ${text}`);
  }
  return { status: reply.status, doc: JSON.parse(text) };
}

const base64 = (s) => Buffer.from(s, "utf8").toString("base64");
const deliverAt = Date.now() + 2_000;

const batch = await call("POST", `/v1/topics/${topic}/messages/batch`, {
  json: {
    messages: [
      { payload: base64("node-0"), deliver_at: deliverAt },
      { text: "node-1", deliver_at: new Date(deliverAt).toISOString() },
      { text: "node-2", deliver_after: 2, key: "order-2", properties: { from: "node" } },
    ],
  },
});
const raw = await call("POST", `/v1/topics/${topic}/messages`, {
  body: new Uint8Array([0, 1, 2, 255]),
  headers: {
    "Content-Type": "application/octet-stream",
    "Raydelay-Deliver-After": "2",
    "Raydelay-Key": "raw-key",
    "Raydelay-Properties": JSON.stringify({ kind: "raw" }),
  },
});
const one = await call("POST", `/v1/topics/${topic}/messages`, {
  json: { text: "node-json", deliver_after: 2 },
});
const cancel = await call("POST", "/v1/cancel", {
  json: { message_ids: [batch.doc.message_ids[1]] },
});
const put1 = await call("PUT", `/v1/topics/${topic}/keys/order-9`, {
  json: { text: "order-9 v1", deliver_after: 2 },
});
const put2 = await call("PUT", `/v1/topics/${topic}/keys/order-9`, {
  json: { text: "order-9 v2", deliver_after: 2.5 },
});
const dup1 = await call("POST", `/v1/topics/${topic}/messages`, {
  json: { text: "dup first", deliver_after: 2, key: "dup" },
});
const dup2 = await call("POST", `/v1/topics/${topic}/messages`, {
  json: { text: "dup second", deliver_after: 2, key: "dup" },
});
const doomed = await call("POST", `/v1/topics/${topic}/messages`, {
  json: { text: "order-5 timeout", deliver_after: 2, key: "order-5" },
});
const byKey = await call("DELETE", `/v1/topics/${topic}/keys/order-5`);
const stats = await call("GET", `/v1/topics/${topic}/stats?subscription=${subscription}`);
const scheduled = await call(
  "GET",
  `/v1/topics/${topic}/subscriptions/${subscription}/scheduled?limit=10`,
);

console.log(
  JSON.stringify({
    statuses: [batch.status, raw.status, one.status, cancel.status],
    batch: batch.doc.message_ids,
    raw: raw.doc.message_id,
    one: one.doc.message_id,
    cancelled: cancel.doc.cancelled,
    put: [put1.doc.message_id, put2.doc.message_id],
    dup: [dup1.doc.message_id, dup2.doc.message_id],
    doomed: doomed.doc.message_id,
    cancelled_by_key: byKey.doc.cancelled,
    stats_keys: Object.keys(stats.doc),
    scheduled: scheduled.doc.map((m) => m.message_id),
  }),
);
