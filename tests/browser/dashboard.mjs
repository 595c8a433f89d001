// Drives Debian's headless Chromium against a running relay's dashboard. Started by the Rust
// test `dashboard::page_in_chromium` (tests/e2e/dashboard.rs), which runs the relay and the
// agents and talks to this script over stdin/stdout, one line per step:
//   script -> test: READY            (page shows both agents)
//   test -> script: SENT <id>        (a new message was sent and acknowledged)
//   script -> test: RETRIED <id>     (dead letter <id> was put back with its Retry button)
//   test -> script: REDELIVERED      (the recipient got it again)
//   script -> test: OK               (every check passed)
// Usage: node dashboard.mjs <dashboard url> <old message id> <old message text> <screenshot.png>
//                           <id of a message whose delivery failed>
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const [url, oldId, oldText, screenshot, failedId] = process.argv.slice(2);
if (!url || !oldId || !oldText || !screenshot || !failedId) {
  console.error('usage: node dashboard.mjs <url> <old id> <old text> <screenshot.png> <failed id>');
  process.exit(2);
}
const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once('line', resolve));
const step = (what) => console.error(`browser: ${what}`);
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const profile = mkdtempSync(join(tmpdir(), 'relay-chromium-'));
// A fresh profile directory (Chromium's --user-data-dir) for every run.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  viewport: { width: 1280, height: 900 },
});
try {
  const page = context.pages()[0] || await context.newPage();
  page.setDefaultTimeout(20000);
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('pageerror', (e) => { console.error(`page error: ${e.message}`); process.exitCode = 1; });

  step('open the dashboard');
  const res = await page.goto(url);
  check(res.status() === 200, `page status ${res.status()}`);
  await page.evaluate(() => { window.__loadedOnce = true; });
  await page.locator('#conn[data-state="live"]').waitFor();
  await page.locator('#agents tr[data-agent="Alice"]').waitFor();
  await page.locator('#agents tr[data-agent="Bob"]').waitFor();
  const aliceState = await page.locator('#agents tr[data-agent="Alice"] .state').textContent();
  check(['idle', 'busy'].includes(aliceState), `Alice shown online, got ${aliceState}`);
  await page.locator(`#flow li[data-id="${oldId}"]`).waitFor();
  console.log('READY');

  const sent = await nextLine();
  const id = sent.replace(/^SENT /, '').trim();
  step(`wait for live message ${id}`);
  const row = page.locator(`#flow li[data-id="${id}"]`);
  await row.waitFor();
  await row.locator('.chip[data-recipient="Bob"][data-state="acked"]').waitFor();
  check(await page.evaluate(() => window.__loadedOnce === true), 'the page was not reloaded');

  step('open its detail and trace');
  await row.click();
  await page.locator('#detail-card:not([hidden])').waitFor();
  // The stored delivery trace, as `agent-relay trace` tells it, in order.
  await page.locator('#trace li[data-event="injected"]').waitFor();
  const stages = await page.locator('#trace li').evaluateAll((lis) => lis.map((li) => li.dataset.event));
  check(JSON.stringify(stages) === JSON.stringify(['accepted', 'queued', 'delivered', 'injected']),
    `trace stages in order: ${stages}`);
  const traceText = await page.locator('#trace').textContent();
  check(traceText.includes('Bob'), `trace names the recipient: ${traceText}`);

  step('search history for the old message');
  await page.fill('#search input[name="text"]', oldText);
  await page.click('#search button[type="submit"]');
  await page.locator(`#results li[data-id="${oldId}"]`).waitFor();
  const found = await page.locator('#results li').count();
  check(found === 1, `search finds exactly the old message, found ${found}`);

  step('screenshot (a dead letter listed, the trace open)');
  await page.locator(`#dead li[data-id="${failedId}"]`).waitFor();
  await page.locator('#stats-card #figures dd').first().waitFor();
  await page.screenshot({ path: screenshot, fullPage: true });

  step('a dead letter, put back with its Retry button');
  const dead = page.locator(`#dead li[data-id="${failedId}"]`);
  await dead.waitFor();
  check(await dead.getAttribute('data-code') === 'failed', 'dead letter code is failed');
  const reason = await dead.locator('.reason').textContent();
  check(reason.includes('could not hand'), `dead letter says why: ${reason}`);
  await dead.locator('button.retry').click();
  await page.locator(`#dead li[data-id="${failedId}"][data-retried="true"]`).waitFor();
  console.log(`RETRIED ${failedId}`);
  const back = await nextLine();
  check(back === 'REDELIVERED', `the recipient got it again: ${back}`);
  // Once retried it leaves the queue (the list shows those not yet retried).
  await dead.waitFor({ state: 'detached' });

  step('narrow window, dark scheme');
  await page.setViewportSize({ width: 380, height: 800 });
  await page.emulateMedia({ colorScheme: 'dark' });
  const layout = await page.evaluate(() => ({
    overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    background: getComputedStyle(document.body).backgroundColor,
  }));
  check(layout.overflow <= 0, `no sideways scrolling in a narrow window (${layout.overflow}px too wide)`);
  const [r, g, b] = layout.background.match(/\d+/g).map(Number);
  check(r + g + b < 150, `dark background in the dark scheme, got ${layout.background}`);
  if (process.env.AGENT_RELAY_SCREENSHOT_NARROW) {
    await page.screenshot({ path: process.env.AGENT_RELAY_SCREENSHOT_NARROW, fullPage: true });
  }

  step('a wrong token is refused');
  const bad = new URL(url);
  bad.searchParams.set('token', '0'.repeat(32));
  const page2 = await context.newPage();
  const refused = await page2.goto(bad.toString());
  check(refused.status() === 401, `wrong token answered ${refused.status()}`);
  const api = await page2.request.get(new URL('/api/messages', url).toString());
  check(api.status() === 401, `API without token answered ${api.status()}`);
  const events = await page2.request.get(`${new URL('/api/events', url)}?token=nope`);
  check(events.status() === 401, `event stream with a wrong token answered ${events.status()}`);

  const foreign = requests.filter((r) => !r.startsWith(new URL(url).origin));
  check(foreign.length === 0, `no request leaves the relay: ${foreign.join(', ')}`);
  console.log('OK');
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  lines.close();
}
