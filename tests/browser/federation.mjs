// The dashboard's federation link (issue 16): started by the Rust test
// `federation::the_dashboard_shows_the_links_state_and_backlog`, one line per step:
//   script -> test: UP     (the page shows the link connected, backlog 0)
//   test -> script: DOWN   (NATS was killed and 3 messages wait for another node)
//   script -> test: OK     (the page shows the link not connected and backlog 3)
// Usage: node federation.mjs <dashboard url>
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const [url] = process.argv.slice(2);
if (!url) {
  console.error('usage: node federation.mjs <url>');
  process.exit(2);
}
const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once('line', resolve));
const profile = mkdtempSync(join(tmpdir(), 'relay-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = context.pages()[0] || await context.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => { console.error(`page error: ${e.message}`); process.exitCode = 1; });
  await page.goto(url);
  const link = page.locator('#link');
  await link.filter({ hasText: 'node hostA' }).filter({ hasText: 'link connected · backlog 0' }).waitFor();
  console.log('UP');
  check((await nextLine()).trim() === 'DOWN', 'DOWN');
  // No live event says the link changed: the page asks again by itself.
  await link.filter({ hasText: 'backlog 3' }).waitFor();
  const text = await link.textContent();
  check(!text.includes('link connected'), `link shown down: ${text}`);
  console.log('OK');
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}
