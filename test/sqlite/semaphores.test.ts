import { defineSemaphoreSuite } from '../suites/semaphores.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineSemaphoreSuite(sqliteFixture, 8);
